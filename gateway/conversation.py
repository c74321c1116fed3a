"""A Responses request's conversation, resolved from the group's stored responses
(gateway/response_store.py) before the call: ``previous_response_id`` brings the chain's input and
output items before the request's own input, and an ``item_reference`` input item becomes the stored
item it names. The expanded conversation is what the provider sees (every group: the gateway never
sends ``previous_response_id`` upstream) and what the reservation's worst case counts.

Items taken from the store go upstream without their ids (an upstream that keeps nothing, as OpenAI
with ``store: false``, refuses ids it does not know) and without reasoning items that carry no
``encrypted_content`` (nothing upstream could read them back).

    expand(store, group_id, body, max_chain)   -> Conversation (the body to send, the items to store)
    own_items(body)                            -> the request's own input items, ids given
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.errors import InvalidRequest, NotFound
from gateway.response_store import ResponseStore
from gateway.responses_events import item_id
from gateway.sealed import sealed

ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def not_found(response_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param=param, code="response_not_found")


@dataclass(slots=True)
class Conversation:
    body: dict[
        str, Any
    ]  # the request with the whole conversation as its input (the caller's if nothing to expand)
    given: Any  # the request's own input, references resolved
    previous: str | None  # the previous_response_id it continues
    expanded: bool  # the input differs from the caller's
    _own: list[Any] | None = None

    @property
    def own(self) -> list[Any]:
        """The request's own input items, each with an id: what is stored (made once, when needed)."""
        if self._own is None:
            self._own = own_items(self.given)
        return self._own


def _part(part: Any, role: str) -> Any:
    return {"type": "output_text" if role == "assistant" else "input_text", "text": part}


def own_item(item: Any) -> Any:
    """An input item as stored (and listed by ``input_items``): a message's text content as parts, an id."""
    if isinstance(item, str):
        item = {"type": "message", "role": "user", "content": item}
    if not isinstance(item, dict):
        return item
    item = dict(item)
    kind = item.setdefault("type", "message")
    if kind == "message" and isinstance(item.get("content"), str):
        item["content"] = [_part(item["content"], str(item.get("role")))]
    if not isinstance(item.get("id"), str):
        item["id"] = item_id(ID_PREFIX.get(str(kind), "item"))
    return item


def own_items(given: Any) -> list[Any]:
    if isinstance(given, str):
        return [own_item(given)]
    return [own_item(item) for item in given] if isinstance(given, list) else []


def upstream_item(item: dict[str, Any]) -> dict[str, Any] | None:
    """A stored item as it goes upstream again: no id; a reasoning item only with its encrypted content,
    and only the provider's own (not what the gateway sealed for another provider: gateway/sealed.py)."""
    if item.get("type") == "reasoning" and (
        not item.get("encrypted_content") or sealed(item["encrypted_content"])
    ):
        return None
    return {k: v for k, v in item.items() if k != "id"}


def _references(given: Any) -> list[tuple[int, str]]:
    refs: list[tuple[int, str]] = []
    for i, item in enumerate(given if isinstance(given, list) else ()):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            ref = item.get("id")
            if not isinstance(ref, str) or not ref:
                raise InvalidRequest(
                    f"'input[{i}].id' must be the id of a stored item.",
                    param=f"input[{i}].id",
                    code="invalid_value",
                )
            refs.append((i, ref))
    return refs


async def _chain(store: ResponseStore, group_id: int, previous: Any, max_chain: int) -> list[Any]:
    if not isinstance(previous, str) or not previous:
        raise InvalidRequest(
            "'previous_response_id' must be a response id.",
            param="previous_response_id",
            code="invalid_value",
        )
    chain = await store.chain(group_id, previous, max_chain)
    if not chain or chain[-1].id != previous:
        raise not_found(previous, "previous_response_id")
    if len(chain) > max_chain:
        raise InvalidRequest(
            f"The conversation of previous_response_id '{previous}' is longer than this gateway's limit of "
            f"{max_chain} responses ([responses] max_chain); start a new one, or send its input in full.",
            param="previous_response_id",
            code="conversation_too_long",
        )
    if chain[0].previous_response_id is not None:  # a link was deleted or expired
        raise not_found(chain[0].previous_response_id, "previous_response_id")
    last = chain[-1]
    if last.status in ("queued", "in_progress"):
        raise InvalidRequest(
            f"The response '{previous}' has not completed yet (status {last.status}); poll it with "
            "GET /v1/responses/{id} first.",
            param="previous_response_id",
            code="response_not_completed",
        )
    items: list[Any] = []
    for stored in chain:
        for item in [*stored.input, *stored.output]:
            sent = upstream_item(item) if isinstance(item, dict) else item
            if sent is not None:
                items.append(sent)
    return items


def plain(body: dict[str, Any]) -> Conversation | None:
    """The request's conversation when nothing in it comes from the store (no await: most calls)."""
    given = body.get("input")
    if body.get("previous_response_id") is None and not (isinstance(given, list) and _references(given)):
        return Conversation(body, given, None, False)
    return None


async def expand(store: ResponseStore, group_id: int, body: dict[str, Any], max_chain: int) -> Conversation:
    """The request's conversation (404 ``response_not_found`` for an unknown previous response, 400
    naming the input index of an ``item_reference`` that names no stored item of the group)."""
    given = body.get("input")
    previous = body.get("previous_response_id")
    refs = _references(given)
    if previous is None and not refs:
        return Conversation(body, given, None, False)
    found = await store.items(group_id, [ref for _, ref in refs]) if refs else {}
    resolved = list(given) if isinstance(given, list) else []
    if isinstance(given, str):
        resolved = [{"role": "user", "content": given}]
    own = [*resolved]
    for i, ref in refs:
        item = found.get(ref)
        if item is None:
            raise InvalidRequest(
                f"'input[{i}]' refers to the item '{ref}', which is not in this conversation: no stored response of "
                "this group holds it (deleted, expired, stored with store: false, or never made here).",
                param=f"input[{i}]",
                code="item_not_found",
            )
        resolved[i] = upstream_item(item)  # (None: a reasoning item nothing upstream can read back)
        own[i] = item
    history = await _chain(store, group_id, previous, max_chain) if previous is not None else []
    sent = dict(body)
    sent["input"] = [*history, *[item for item in resolved if item is not None]]
    sent.pop("previous_response_id", None)
    return Conversation(sent, own, previous if isinstance(previous, str) else None, True)

"""Every call made with a valid key leaves exactly one usage record, whatever becomes of it: answered
(``ok``), failed after its reservation (``error``), or refused before anything was reserved
(``rejected``: a bad body, an unknown model, one the key may not use, a capability the model lacks,
too few credits), with no credits and the error's code. A call without a valid key has no group to
record it in. Records carry the request's ``user`` and, for a job's line, the batch id (test_batches)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import openai
import pytest

from tests.conftest import Stack, raw_request

HI: Any = [{"role": "user", "content": "hi"}]
IMAGE: Any = [
    {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}],
    }
]


def test_every_call_leaves_one_record(stack: Stack) -> None:
    group = stack.group(0.001)  # a few short answers, not a long one
    key = stack.key(group=group, models=["openai/gpt-4o-mini", "upstage/solar-mini"])
    client = stack.client(key)
    made: Counter[str] = Counter()

    def refused(status: int, code: str, **call: Any) -> None:
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(**call)
        assert info.value.status_code == status and info.value.code == code, info.value  # type: ignore[attr-defined]
        made[code] += 1

    for stream in (False, True):
        client.chat.completions.create(
            model="openai/gpt-4o-mini", messages=HI, stream=stream, user="alice", max_tokens=20
        )
        made["ok"] += 1
        refused(404, "model_not_found", model="openai/no-such-model", messages=HI, stream=stream)
        refused(403, "model_not_allowed", model="anthropic/claude-haiku-4-5", messages=HI, stream=stream)
        refused(400, "image_input_unsupported", model="upstage/solar-mini", messages=IMAGE, stream=stream)
        refused(
            402,
            "insufficient_credits",
            model="openai/gpt-4o-mini",
            messages=HI,
            max_tokens=16_000,
            stream=stream,
        )
    bad = raw_request(
        stack,
        "POST",
        "/v1/chat/completions",
        b"{not json",
        {"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    assert bad.status == 400
    made["invalid_json"] += 1
    nobody = raw_request(stack, "POST", "/v1/chat/completions", b"{}", {"authorization": "Bearer sk-nope"})
    assert nobody.status == 401  # no key, no group: not recorded

    records = stack.run(stack.store.usage(group=group, limit=100))
    assert len(records) == sum(made.values()) == 11
    codes = Counter("ok" if r.status == "ok" else r.error_code for r in records)
    assert codes == made
    rejected = [r for r in records if r.status == "rejected"]
    assert all(r.credits == 0 and r.error and r.request_id and r.key_id for r in rejected)
    assert {r.model for r in rejected if r.error_code == "model_not_found"} == {"openai/no-such-model"}
    assert {r.stream for r in rejected if r.error_code == "model_not_found"} == {False, True}
    assert [r.end_user for r in records if r.status == "ok"] == ["alice", "alice"]
    g = stack.run(stack.store.get_group(group))
    assert g is not None and g.spent == sum(r.credits for r in records) and g.reserved == 0


def test_responses_refusals_are_recorded(stack: Stack) -> None:
    group = stack.group(5)
    client = stack.client(stack.key(group=group))
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nobody/nothing", input="hi", user="bob")
    (record,) = stack.run(stack.store.usage(group=group, limit=10))
    assert (record.status, record.endpoint, record.error_code, record.end_user) == (
        "rejected",
        "responses",
        "model_not_found",
        "bob",
    )

"""Every change an operator makes, in one place for the three ways to make it (the console's forms,
the admin API, the CLI): the change through the store, then its audit record (billing/audit.py) with
who made it and the object before and after. Each surface builds a :class:`Changes` with its actor:
``console`` (the logged-in admin), ``admin-api`` (the admin token), ``cli:<OS user>``; the client's
address is added where there is one.

The record is written after the change commits (the store's operations are their own transactions):
a change whose record cannot be written is still made, and the failure is logged (``router.audit``)
and raised to the caller, who answers with an error saying so.
"""

from __future__ import annotations

import dataclasses
import getpass
import logging
from collections.abc import Callable
from typing import Any

from billing import budgets
from billing.alerts import AlertBook, Webhook
from billing.audit import Audit
from billing.budgets import BudgetState
from billing.store import Group, KeyInfo, KeyMeta, Store, StoreError
from console.operators import Operator, OperatorError, Operators
from core.config import Settings
from gateway.auth import new_key, rotate_key

log = logging.getLogger("router.audit")


def snapshot(thing: Group | KeyInfo | None) -> dict[str, Any] | None:
    """A group or key as the audit log keeps it (a key's hint, never its secret or hash)."""
    return None if thing is None else dataclasses.asdict(thing)


def cli_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}"


class Changes:
    def __init__(
        self, store: Store, audit: Audit, actor: str, forget: Callable[[], None] | None = None
    ) -> None:
        self.store = store
        self.audit = audit
        self.actor = actor
        self.forget = forget or (lambda: None)  # the gateway's key cache, after a change to a key

    async def record(self, action: str, target: str, before: Any, after: Any) -> None:
        try:
            await self.audit.record(self.actor, action, target, before, after)
        except Exception:
            log.exception(
                "audit record of %s on %s by %s failed (the change was made)", action, target, self.actor
            )
            raise

    # -- groups -------------------------------------------------------------------------------------
    async def create_group(self, name: str, credits: int) -> Group:
        group = await self.store.create_group(name, credits)
        await self.record("group.create", f"group:{name}", None, snapshot(group))
        return group

    async def topup(self, name: str, amount: int) -> Group:
        before = await self.store.get_group(name)
        group = await self.store.topup(name, amount)
        await self.record(
            "group.topup", f"group:{name}", snapshot(before), {**(snapshot(group) or {}), "added": amount}
        )
        return group

    # -- keys ---------------------------------------------------------------------------------------
    async def create_key(
        self,
        settings: Settings,
        group: str,
        name: str,
        cap: int | None,
        allowed: list[str] | None,
        meta: KeyMeta | None = None,
    ) -> tuple[str, KeyInfo]:
        key, info = await new_key(self.store, settings, group, name, cap, allowed, meta=meta)
        self.forget()  # (a digest looked up before it existed is no longer unknown)
        await self.record("key.create", f"key:{info.id}", None, snapshot(info))
        return key, info

    async def update_key(
        self, info: KeyInfo, cap: int | None, allowed: list[str] | None, meta: KeyMeta | None = None
    ) -> KeyInfo:
        updated = info
        if cap != info.spend_cap or tuple(allowed or ()) != tuple(info.allowed_models or ()):
            updated = await self.store.update_key(info.id, cap, allowed)
        if meta is not None and meta != KeyMeta(info.expires_at, info.tags, info.owner):
            updated = await self.store.set_key_meta(info.id, meta)
        self.forget()
        if updated is not info:
            await self.record("key.update", f"key:{info.id}", snapshot(info), snapshot(updated))
        return updated

    async def rotate_key(self, settings: Settings, info: KeyInfo, grace: float) -> tuple[str, KeyInfo]:
        key, updated = await rotate_key(self.store, settings, info.id, grace)
        self.forget()
        await self.record("key.rotate", f"key:{info.id}", snapshot(info), snapshot(updated))
        return key, updated

    async def revoke_key(self, key_id: int) -> bool:
        before = await self.store.get_key(key_id)
        if before is None:
            raise StoreError(f"no key with id {key_id}")
        done = await self.store.revoke_key(key_id)
        self.forget()
        if done:
            await self.record(
                "key.revoke", f"key:{key_id}", snapshot(before), snapshot(await self.store.get_key(key_id))
            )
        return done

    # -- budgets ------------------------------------------------------------------------------------
    async def add_budget(
        self, group: str, amount: int, window: str, key_id: int | None, tz: str
    ) -> BudgetState:
        made = await budgets.add(self.store, group, amount, window, key_id, tz)
        state = await self._budget(made.id)
        await self.record("budget.add", f"budget:{made.id}", None, state.as_dict() if state else None)
        assert state is not None
        return state

    async def set_budget_amount(self, budget_id: int, amount: int) -> BudgetState | None:
        before = await self._budget(budget_id)
        if before is None or not await budgets.set_amount(self.store, budget_id, amount):
            return None
        after = await self._budget(budget_id)
        await self.record(
            "budget.update", f"budget:{budget_id}", before.as_dict(), after.as_dict() if after else None
        )
        return after

    async def remove_budget(self, budget_id: int) -> BudgetState | None:
        """The budget removed, as it was; None if there was none with that id."""
        before = await self._budget(budget_id)
        if before is None or not await budgets.remove(self.store, budget_id):
            return None
        await self.record("budget.remove", f"budget:{budget_id}", before.as_dict(), None)
        return before

    async def _budget(self, budget_id: int) -> BudgetState | None:
        return await budgets.state(self.store, budget_id)

    # -- webhooks -----------------------------------------------------------------------------------
    async def add_webhook(
        self,
        book: AlertBook,
        url: str,
        group: str | None,
        balance_below: int | None,
        expiry_within: float | None,
        budgets: bool = True,
    ) -> Webhook:
        hook = await book.add_webhook(url, group, balance_below, expiry_within, budgets)
        await self.record("webhook.create", f"webhook:{hook.id}", None, hook.json())  # never its secret
        return hook

    async def delete_webhook(self, book: AlertBook, webhook_id: int) -> bool:
        hook = await book.webhook(webhook_id)
        if hook is None or not await book.delete_webhook(webhook_id):
            raise StoreError(f"no webhook with id {webhook_id}")
        await self.record("webhook.delete", f"webhook:{webhook_id}", hook.json(), None)
        return True

    # -- operators (never a password, its hash or a token in the record) --------------------------
    async def add_operator(
        self, book: Operators, name: str, role: str, groups: list[str], password_hash: str
    ) -> Operator:
        for group in groups:
            if await self.store.get_group(group) is None:
                raise OperatorError(f"no group named {group!r}", "groups")
        made = await book.add(name, role, groups, password_hash)
        await self.record("operator.add", f"operator:{made.name}", None, made.json())
        return made

    async def operator_password(self, book: Operators, name: str, password_hash: str) -> None:
        """A new password: its fingerprint changes, so its sessions end."""
        if not await book.set_password(name, password_hash):
            raise OperatorError(f"no operator named {name!r}")
        await self.record("operator.password", f"operator:{name}", None, {"set": True})

    async def operator_token(self, book: Operators, name: str, token: str) -> None:
        if not await book.set_token(name, token):
            raise OperatorError(f"no operator named {name!r}")
        await self.record("operator.token", f"operator:{name}", None, {"set": True})

    async def remove_operator(self, book: Operators, name: str) -> Operator:
        found = await book.get(name)  # (as it was, for the audit)
        if found is None or not await book.remove(name):
            raise OperatorError(f"no operator named {name!r}")
        await self.record("operator.remove", f"operator:{name}", found.json(), None)
        return found

    # -- settings -----------------------------------------------------------------------------------
    async def setting(self, name: str, before: Any, after: Any) -> None:
        """A console or gateway setting changed elsewhere (the console password: only that it is set)."""
        await self.record(f"settings.{name}", f"settings:{name}", before, after)


def cli_changes(store: Store) -> Changes:
    """The operator's changes from this command line, audited as ``cli:<OS user>``."""
    return Changes(store, Audit(store.database), cli_actor())

"""The ledger's rules, once, for every ledger (SQLite's in-memory holds, PostgreSQL's batches in Python
and, mirrored, its PL/pgSQL ``ledger_batch``): pure functions of the numbers each one reads.

    refusal(amount, key_room, over, group_room)   whether a reservation of ``amount`` is refused, and why
    charge(credits, balance, held)                what a settlement charges

The precedence of the refusals: the key's spend cap, then a budget (the key's, then the group's), then
the group's balance. The narrowest limit and the operator's own policies first: a cap or a budget says
this spend is not allowed whatever the balance, and lifting them needs someone else than a top-up does;
the balance says whether the group could pay at all. A call short of both a budget and its balance is
told ``budget_exceeded`` on every store.
"""

from __future__ import annotations

from collections.abc import Callable

from billing.budgets import Exceeded
from billing.store import Refusal


def refusal(
    amount: int, key_room: int | None, over: Callable[[], Exceeded | None] | None, group_room: int
) -> Refusal | None:
    """The refusal of a reservation of ``amount`` nano-credits, or None: ``key_room`` is what the key's
    cap leaves (None: no cap), ``over`` finds the budget it would exceed (read only when the cap
    allows it), ``group_room`` what the group's balance leaves; each net of the calls in flight."""
    if key_room is not None and key_room < amount:
        return Refusal("key_cap", max(key_room, 0), amount)
    exceeded = over() if over is not None else None
    if exceeded is not None:
        return Refusal(
            "budget",
            max(exceeded.budget.amount - exceeded.used, 0),
            amount,
            exceeded.budget.describe(),
            exceeded.resets_at,
        )
    if group_room < amount:
        return Refusal("balance", max(group_room, 0), amount)
    return None


def charge(credits: int, balance: int, held: int) -> int:
    """What a settlement of a call that cost ``credits`` charges its group, whose ``balance`` is net of
    what is reserved and ``held`` of which is this call's reservation (released first): never more
    than the group has left, never negative."""
    return min(credits, balance + held) if credits > 0 else 0

"""``router budgets``: budgets with periods for a group or a key (billing/budgets.py).

    router budgets add --group NAME [--key ID] --amount CREDITS --window day|week|month|<n>s|m|h|d [--tz ZONE]
    router budgets list [--group NAME] [--key ID]
    router budgets set ID --amount CREDITS       (its window and what was spent in it stay)
    router budgets remove ID

A bad window, time zone or amount is a one-line error; ``--tz`` defaults to ``[billing] timezone``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from billing import budgets
from billing.backends import with_store
from billing.store import Store
from console.changes import cli_changes
from core.config import Settings
from core.money import to_credits, to_nano


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "budgets",
        help="budgets with periods for a group or a key: add, list, set, remove",
        description="Spend limits per window (a calendar day/week/month, or rolling).",
    )
    bsub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = bsub.add_parser(
        "add", help="a budget for a group (or one of its keys)", description="Add a budget."
    )
    add.add_argument("--group", required=True, help="the group (its budget, or its key's)")
    add.add_argument("--key", type=int, help="the key's id, for a key's budget")
    add.add_argument("--amount", required=True, metavar="CREDITS", help="credits per window")
    add.add_argument("--window", required=True, help="day, week, month (calendar) or a rolling 30m, 12h, 7d")
    add.add_argument("--tz", help="time zone of a calendar window (default: [billing] timezone)")
    ls = bsub.add_parser(
        "list", help="budgets with their current window's spend", description="List budgets."
    )
    ls.add_argument("--group", help="only this group's")
    ls.add_argument("--key", type=int, help="only this key's")
    st = bsub.add_parser(
        "set",
        help="a budget's new amount (its window and spend stay)",
        description="Change a budget's amount.",
    )
    st.add_argument("id", type=int, help="the budget's id (router budgets list)")
    st.add_argument("--amount", required=True, metavar="CREDITS", help="credits per window")
    rm = bsub.add_parser("remove", help="delete a budget", description="Remove a budget.")
    rm.add_argument("id", type=int, help="the budget's id (router budgets list)")


def _amount(text: str) -> int:
    """``--amount`` in nano-credits; a bad one is a BudgetError (the command's one-line error)."""
    try:
        return to_nano(text)
    except ValueError as exc:
        raise budgets.BudgetError(str(exc)) from None


def run(args: argparse.Namespace, settings: Settings) -> None:
    try:
        if args.action == "add":
            amount = _amount(args.amount)
            tz = args.tz or settings.billing.timezone

            async def add(store: Store) -> budgets.BudgetState:
                return await cli_changes(store).add_budget(args.group, amount, args.window, args.key, tz)

            made = asyncio.run(with_store(settings.store.url, add)).budget
            print(f"budget {made.id}: {made.describe(args.group)}")
        elif args.action == "set":
            amount = _amount(args.amount)
            changed = asyncio.run(
                with_store(settings.store.url, lambda s: cli_changes(s).set_budget_amount(args.id, amount))
            )
            if changed is None:
                raise SystemExit(f"error: no budget with id {args.id}")
            print(f"budget {args.id}: {changed.budget.describe(changed.group_name)}")
        elif args.action == "remove":
            if (
                asyncio.run(with_store(settings.store.url, lambda s: cli_changes(s).remove_budget(args.id)))
                is None
            ):
                raise SystemExit(f"error: no budget with id {args.id}")
            print(f"budget {args.id} removed")
        else:
            found = asyncio.run(
                with_store(settings.store.url, lambda s: budgets.states(s, args.group, args.key))
            )
            print(
                f"{'id':>4}  {'group':<20} {'key':>5} {'window':<22} {'amount':>12} {'spent':>12}  resets at"
            )
            for s in found:
                b = s.budget
                window = b.period.name + (f" ({b.period.tz})" if b.period.calendar else " rolling")
                key = str(b.key_id) if b.key_id is not None else "-"
                print(
                    f"{b.id:>4}  {s.group_name:<20} {key:>5} {window:<22} {to_credits(b.amount):>12} "
                    f"{to_credits(s.spent):>12}  {budgets.iso(s.resets_at)}"
                )
    except budgets.BudgetError as exc:
        raise SystemExit(f"error: {exc}") from None

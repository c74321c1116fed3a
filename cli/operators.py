"""``router operators ...``: the console's named operators (console/operators.py).

router operators add NAME --role admin|viewer|operator [--group G ...] [--stdin]
                                  an account with its own password (prompted twice, or read from
                                  standard input); --group: the groups an operator operates
router operators list             the accounts, their roles and groups
router operators password NAME [--stdin]
                                  a new password: the account's sessions end
router operators token NAME       a new admin API token for the account, printed once (the old one
                                  stops working)
router operators remove NAME      the account goes, and its sessions end

Each change is in the audit log as ``operator.*`` (never a password, its hash or a token).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from billing.backends import with_store
from billing.store import Store
from cli.console import read_password
from console import auth, operators
from console.changes import cli_changes
from console.queries import queries_for
from core.config import Settings


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "operators",
        help="the console's operators: add, list, password, token, remove",
        description="Named accounts for the console and the admin API, each with a role.",
    )
    osub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = osub.add_parser("add", help="an operator with its own password", description="Add an operator.")
    add.add_argument("name", help="its login name: a-z, 0-9, '.', '_', '-'")
    add.add_argument(
        "--role",
        required=True,
        choices=operators.ROLES,
        help="admin: everything; viewer: sees and exports, changes nothing; operator: its groups only",
    )
    add.add_argument("--group", action="append", default=[], help="a group the operator operates (repeat)")
    add.add_argument("--stdin", action="store_true", help="read the password from standard input")
    osub.add_parser("list", help="the operators", description="List the operators.")
    pw = osub.add_parser(
        "password", help="a new password (the account's sessions end)", description="Set a password."
    )
    pw.add_argument("name", help="the operator")
    pw.add_argument("--stdin", action="store_true", help="read the password from standard input")
    tok = osub.add_parser(
        "token", help="a new admin API token, printed once", description="Make an API token."
    )
    tok.add_argument("name", help="the operator")
    rm = osub.add_parser(
        "remove", help="delete an operator (its sessions end)", description="Remove an operator."
    )
    rm.add_argument("name", help="the operator")


def run(args: argparse.Namespace, settings: Settings) -> None:
    action = args.action
    hashed = auth.hash_password(read_password(args.stdin)) if action in ("add", "password") else ""
    token = operators.new_token() if action == "token" else ""

    async def act(store: Store) -> str:
        queries = queries_for(store)
        await queries.ready()
        book = queries.operators
        changes = cli_changes(store)
        if action == "list":
            rows = await book.all()
            return (
                "\n".join(
                    f"{o.name:<24} {o.role:<9} {', '.join(o.groups) or '(every group)'}"
                    f"{'  (has an API token)' if o.token_hash else ''}"
                    for o in rows
                )
                or "no operators"
            )
        if action == "add":
            made = await changes.add_operator(book, args.name, args.role, args.group, hashed)
            return f"operator {made.name} ({made.role}) added"
        if action == "password":
            await changes.operator_password(book, args.name, hashed)
            return f"operator {args.name}: password set; its sessions are logged out"
        if action == "token":
            await changes.operator_token(book, args.name, token)
            return (
                f"operator {args.name}'s admin API token (shown once; the old one no longer works):\n{token}"
            )
        found = await changes.remove_operator(book, args.name)
        return f"operator {found.name} removed"

    try:
        print(asyncio.run(with_store(settings.store.url, act)))
    except operators.OperatorError as exc:
        raise SystemExit(f"error: {exc}") from None

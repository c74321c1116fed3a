"""``router console ...``: the console's admin commands.

router console set-password [--stdin]    store the admin password's scrypt hash (prompted twice,
                                         or read from standard input); every session is logged out
router console hash-password [--stdin]   print a hash for ``[console] password_hash`` instead
"""

from __future__ import annotations

import argparse
import getpass
import secrets
import sys

from billing.audit import Audit
from billing.store import Store
from console import auth
from console.changes import Changes, cli_actor
from console.queries import queries_for
from core.config import Settings


def add_commands(sub: argparse._SubParsersAction) -> None:
    console = sub.add_parser(
        "console",
        help="the management console at /console: its admin password",
        description="The management console's admin password.",
    )
    csub = console.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (
        ("set-password", "set the console's admin password (kept as an scrypt hash in the store)"),
        ("hash-password", "print an scrypt hash for [console] password_hash"),
    ):
        cmd = csub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        cmd.add_argument("--stdin", action="store_true", help="read the password from standard input")


def read_password(from_stdin: bool) -> str:
    if from_stdin or not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass("New console password: ")
        if getpass.getpass("Again: ") != password:
            raise SystemExit("error: the passwords differ")
    problem = auth.password_problem(password)
    if problem:
        raise SystemExit(f"error: {problem}")
    return password


async def store_password(store: Store, hashed: str) -> None:
    queries = queries_for(store)
    await queries.set_setting(auth.PASSWORD_SETTING, hashed)
    await queries.set_setting(auth.SECRET_SETTING, secrets.token_urlsafe(32))
    # every open session ends, on every replica, also with [console] session_secret
    await queries.sessions_end_all()


def run(args: argparse.Namespace, settings: Settings) -> None:
    import asyncio

    from billing.backends import with_store

    hashed = auth.hash_password(read_password(args.stdin))
    if args.action == "hash-password":
        print(hashed)
        return

    async def set_and_audit(store: Store) -> None:
        await store_password(store, hashed)
        # the audit log says that the password changed, never the password or its hash
        await Changes(store, Audit(store.database), cli_actor()).setting(
            "console_password", None, {"set": True}
        )

    asyncio.run(with_store(settings.store.url, set_and_audit))
    if settings.console.password_hash:
        print(
            "note: [console] password_hash in the config takes precedence over the stored password",
            file=sys.stderr,
        )
    print("console password set; every open session is logged out")

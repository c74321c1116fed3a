"""Who operates the gateway: named operator accounts, each with its own password (scrypt, as the
admin password) and, for the admin API, its own token (kept as its SHA-256), and one role:

- ``admin``: everything, as the built-in account does (the admin password and ``[console] admin_token``
  are the account named ``admin``);
- ``viewer``: sees and exports everything, changes nothing;
- ``operator``: sees and changes only the groups it is given (their keys, budgets, top-ups, calls and
  batches); nothing of any other group, and nothing across groups (the overview, the audit log, the
  webhooks, the configuration).

The first accounts are made with the CLI (``router operators add``). What the request's operator is
allowed is decided here, once, by :class:`Operator`'s methods; the pages and the admin API ask
through :func:`current` (a context variable the page and API wrappers set for the request) and the
helpers that find a group or a key answer 404 for a group the operator does not see, as if it did not
exist.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass

from billing.store import Database

ROLES = ("admin", "viewer", "operator")
BUILT_IN = "admin"  # the account of the admin password and the admin token
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
TOKEN_PREFIX = "mro-"  # noqa: S105 (a prefix, not a secret): an operator's API token (an API key is never a console credential)


class OperatorError(ValueError):
    """A name, role or group list an account cannot have; the message says which, ``field`` names it
    (``name``, ``role`` or ``groups``: the console's form puts the message beside it)."""

    def __init__(self, message: str, field: str = "name") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Operator:
    name: str
    role: str
    groups: tuple[str, ...] = ()
    password_hash: str = ""
    token_hash: str = ""

    def json(self) -> dict[str, object]:
        """As the audit log and the CLI show it (never its password hash or token)."""
        return {"name": self.name, "role": self.role, "groups": list(self.groups)}

    @property
    def read_only(self) -> bool:
        """Whether it may change nothing at all (the viewer: it sees and exports)."""
        return self.role == "viewer"

    @property
    def every_group(self) -> bool:
        """Whether it may see across groups (the overview, the audit log, the webhooks)."""
        return self.role != "operator"

    def sees(self, group: str | None) -> bool:
        return self.role != "operator" or (group is not None and group in self.groups)

    def changes(self, group: str | None = None) -> bool:
        """Whether it may change this group's things (``None``: what is not a group's: new groups,
        webhooks, the configuration)."""
        if self.role == "admin":
            return True
        return self.role == "operator" and group is not None and group in self.groups

    @property
    def fingerprint(self) -> str:
        """What its sessions logged in against: a new password or role ends them."""
        return hashlib.sha256(
            f"{self.name}\0{self.role}\0{self.password_hash}\0{','.join(self.groups)}".encode()
        ).hexdigest()


ADMIN = Operator(BUILT_IN, "admin")
NOBODY = Operator("nobody", "operator")  # what a request is before it is authenticated: sees nothing
_current: contextvars.ContextVar[Operator] = contextvars.ContextVar("operator", default=NOBODY)


def current() -> Operator:
    """The operator of the request being served (fails closed: nobody, until the request's session
    or token says who)."""
    return _current.get()


def acting(operator: Operator) -> None:
    """The request's operator, from here to its end (each request runs in a task of its own)."""
    _current.set(operator)


def check(name: str, role: str, groups: list[str]) -> None:
    if not NAME.fullmatch(name) or name == BUILT_IN:
        raise OperatorError(
            f"{name!r}: an operator's name is 1 to 64 of a-z, 0-9, '.', '_', '-' "
            f"(starting with a letter or digit), and not {BUILT_IN!r}"
        )
    if role not in ROLES:
        raise OperatorError(f"{role!r}: the role is one of {', '.join(ROLES)}", "role")
    if role == "operator" and not groups:
        raise OperatorError("an operator's role needs the groups it operates (--group)", "groups")
    if role != "operator" and groups:
        raise OperatorError(f"a {role} sees every group: --group is for the operator role", "groups")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


MIGRATION = (
    "CREATE TABLE console_operators (name TEXT PRIMARY KEY, role TEXT NOT NULL, groups TEXT NOT NULL, "
    "password_hash TEXT NOT NULL, token_hash TEXT, created_at DOUBLE PRECISION NOT NULL)"
)
_COLUMNS = "name, role, groups, password_hash, token_hash"


def _row(row: tuple[object, ...]) -> Operator:
    return Operator(str(row[0]), str(row[1]), tuple(json.loads(str(row[2]))), str(row[3]), str(row[4] or ""))


class Operators:
    """The accounts, on the store's database handle (the console's migrations made the table)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(self, name: str, role: str, groups: list[str], password_hash: str) -> Operator:
        check(name, role, groups)
        if await self.get(name) is not None:
            raise OperatorError(f"there is already an operator named {name!r}")
        await self.db.write(
            f"INSERT INTO console_operators ({_COLUMNS}, created_at) VALUES (?, ?, ?, ?, NULL, ?)",
            (name, role, json.dumps(sorted(set(groups))), password_hash, time.time()),
        )
        found = await self.get(name)
        assert found is not None
        return found

    async def get(self, name: str) -> Operator | None:
        rows = await self.db.select(f"SELECT {_COLUMNS} FROM console_operators WHERE name = ?", (name,))
        return _row(rows[0]) if rows else None

    async def all(self) -> list[Operator]:
        return [
            _row(r) for r in await self.db.select(f"SELECT {_COLUMNS} FROM console_operators ORDER BY name")
        ]

    async def by_token(self, token: str) -> Operator | None:
        if not token.startswith(TOKEN_PREFIX):
            return None
        wanted = token_hash(token)
        rows = await self.db.select(
            f"SELECT {_COLUMNS} FROM console_operators WHERE token_hash = ?", (wanted,)
        )
        found = _row(rows[0]) if rows else None
        return found if found is not None and hmac.compare_digest(found.token_hash, wanted) else None

    async def set_password(self, name: str, password_hash: str) -> bool:
        return await self._changed(
            "UPDATE console_operators SET password_hash = ? WHERE name = ?", (password_hash, name)
        )

    async def set_token(self, name: str, token: str) -> bool:
        return await self._changed(
            "UPDATE console_operators SET token_hash = ? WHERE name = ?", (token_hash(token), name)
        )

    async def remove(self, name: str) -> bool:
        return await self._changed("DELETE FROM console_operators WHERE name = ?", (name,))

    async def _changed(self, sql: str, args: tuple[object, ...]) -> bool:
        """Whether the statement changed the account (False: there is none of that name)."""
        changed = await self.db.atomic([(sql, args)])
        return changed[0] > 0

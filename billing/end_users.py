"""End users: who a call was made for, as the caller says (OpenAI's ``user``, ``safety_identifier``
and ``metadata``), kept on each usage record, and the usage per end user that the admin API shows.

The columns ``safety_identifier`` and ``metadata`` (compact JSON of the request's string map) were
added to the usage table after it was made: their migration has a version table of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VERSION_TABLE = "end_user_schema_version"
MIGRATIONS = {
    "sqlite": [
        "ALTER TABLE usage ADD COLUMN safety_identifier TEXT; ALTER TABLE usage ADD COLUMN metadata TEXT;"
    ],
    "postgres": ["ALTER TABLE usage ADD COLUMN safety_identifier TEXT, ADD COLUMN metadata TEXT"],
}

PER_USER = (
    "SELECT end_user, count(*), sum(prompt_tokens), sum(completion_tokens), sum(credits), max(ts) FROM usage "
    "WHERE group_id = ? AND ts >= ? AND ts < ? AND end_user IS NOT NULL {key} "
    "GROUP BY end_user ORDER BY sum(credits) DESC, end_user LIMIT ?"
)


@dataclass(frozen=True, slots=True)
class UserUsage:
    user: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    credits: int
    last_ts: float


async def per_user(
    database: Any, group_id: int, since: float, until: float, key_id: int | None = None, limit: int = 100
) -> list[UserUsage]:
    """The end users of a group (or of one of its keys) between ``since`` and ``until``, most credits first."""
    args: list[Any] = [group_id, since, until]
    key = ""
    if key_id is not None:
        key = "AND key_id = ?"
        args.append(key_id)
    rows = await database.select(PER_USER.format(key=key), [*args, limit])
    return [
        UserUsage(str(r[0]), int(r[1]), int(r[2] or 0), int(r[3] or 0), int(r[4] or 0), float(r[5] or 0))
        for r in rows
    ]

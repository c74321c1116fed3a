"""API keys: their form, their hash, and turning an ``Authorization`` header into a principal.

A key is ``<prefix>-v1-<43 url-safe characters>`` (256 random bits). Only its SHA-256 is stored: the
key is random, so a slow password hash would buy nothing. A header that does not have the form is
rejected before any store lookup. The store is searched by digest, so how long a lookup takes says
nothing about the key itself (the constant-time property that matters). Looked-up principals are cached for a couple of seconds so the hot
path does not touch the store, and the calls that miss the cache together share one lookup
(core/flights.py); a revocation through this process clears the cache at once, and one
through another process takes effect within ``auth_cache_seconds``. A key the store does not know
(revoked, or never issued) is remembered as unknown for as long: a client that keeps calling with a
revoked key (a stale deployment's retry loop) costs the store one lookup per ``auth_cache_seconds``,
not one per call, so it cannot take the store's time (SQLite's one thread, PostgreSQL's pool) from the
calls of the keys that work. A key created through this process clears that memory too.

A principal carries its secret's deadline (the key's ``expires_at``; for the secret a rotation
replaced, the end of its grace period), checked on every call, cached or not: an expired key is
refused at its expiry on every replica (401 ``key_expired``), an old secret at the end of its grace
(401 ``key_rotated``). A rotation or a new expiry set through another process reaches a replica's
cache within ``auth_cache_seconds``. When a key was last used is noted when its principal is loaded
(so within ``auth_cache_seconds`` of the truth, at no cost per call) and written to the store in one
batch every ``LAST_USED_SECONDS`` (:class:`LastUsed`), never on the call path.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from typing import Any

from billing.store import KeyInfo, KeyMeta, Principal, Store, StoreDown
from core import metrics
from core.config import Settings
from core.errors import StoreUnavailable, Unauthorized
from core.flights import Flights


def generate_key(prefix: str) -> str:
    return f"{prefix}-v1-{secrets.token_urlsafe(32)}"


def key_form(prefix: str) -> re.Pattern[str]:
    """What a key looks like: ``<prefix>-v1-`` and 32 to 128 url-safe characters."""
    return re.compile(rf"^{re.escape(prefix)}-v1-[A-Za-z0-9_-]{{32,128}}$")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_hint(key: str) -> str:
    head, _, _ = key.partition("-v1-")
    return f"{head}-v1-...{key[-4:]}"


async def new_key(
    store: Store,
    settings: Settings,
    group: str,
    name: str,
    spend_cap: int | None = None,
    models: list[str] | None = None,
    key: str | None = None,
    meta: KeyMeta | None = None,
) -> tuple[str, Any]:
    """Issue a key for ``group``: the clear key (shown once) and the stored key's info."""
    key = key or generate_key(settings.server.key_prefix)
    info = await store.create_key(group, name, hash_key(key), key_hint(key), spend_cap, models, meta)
    return key, info


async def rotate_key(store: Store, settings: Settings, key_id: int, grace: float) -> tuple[str, KeyInfo]:
    """A new secret for key ``key_id`` (shown once); the old one works ``grace`` seconds more."""
    key = generate_key(settings.server.key_prefix)
    return key, await store.rotate_key(key_id, hash_key(key), key_hint(key), grace)


LAST_USED_SECONDS = 60.0  # how often the last-used times noted by the authenticator are written


class LastUsed:
    """When each key was last used, noted in memory and written to the store in one transaction per
    interval (``flush``): at most one write per key a minute, none on the call path. A flush that
    fails (store down) keeps its times for the next one."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.noted: dict[int, float] = {}

    def note(self, key_id: int, when: float) -> None:
        self.noted[key_id] = when

    async def flush(self) -> None:
        noted, self.noted = self.noted, {}
        try:
            await self.store.touch_keys(noted)
        except Exception:
            for key_id, when in noted.items():  # keep them (newer ones noted meanwhile win)
                self.noted.setdefault(key_id, when)
            raise


def may_use(principal: Principal, model_id: str, asked: str) -> bool:
    """Whether the key may call the model ``model_id`` (catalog id), asked for as ``asked``."""
    allowed = principal.allowed_models
    return allowed is None or model_id in allowed or asked in allowed


class Authenticator:
    def __init__(self, store: Store, prefix: str, cache_seconds: float = 2.0) -> None:
        self.store = store
        self.cache_seconds = cache_seconds
        self._form = key_form(prefix)
        # digest -> (its principal, or None: the store did not know it; until when that holds)
        self._cache: dict[str, tuple[Principal | None, float]] = {}
        self._lookups: Flights[Principal | None] = Flights()  # concurrent misses of one key: one lookup
        self.last_used = LastUsed(store)

    def forget(self) -> None:
        self._cache.clear()

    async def authenticate(self, header: str | None) -> Principal:
        if not header:
            raise Unauthorized(
                "You didn't provide an API key. Send it in the Authorization header as 'Bearer YOUR_KEY'.",
                code="missing_api_key",
            )
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Unauthorized("The Authorization header must be 'Bearer YOUR_KEY'.")
        if not self._form.match(key):
            raise Unauthorized(
                "Incorrect API key provided: it does not have the form of a key of this service."
            )
        digest = hash_key(key)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[1] > now:
            # looked up again ahead of time, waited for by nobody
            if cached[1] - now < self.cache_seconds / 2:
                self._lookups.ahead(digest, lambda: self._lookup(digest))
            hit = cached[0]
            if hit is None:
                raise _unknown_key()
            if hit.deadline is not None:
                _check_deadline(hit.deadline, hit.deadline_code, time.time())
            return hit
        try:
            principal = await self._lookups.fresh(digest, lambda: self._lookup(digest))
        except StoreDown:
            metrics.store_error("lookup")
            raise StoreUnavailable() from None
        if principal is None:
            raise _unknown_key()
        wall = time.time()
        if principal.deadline is not None:
            _check_deadline(principal.deadline, principal.deadline_code, wall)
        self.last_used.note(principal.key_id, wall)
        return principal

    async def _lookup(self, digest: str) -> Principal | None:
        """The store's answer for a key, kept for ``cache_seconds`` from when it came."""
        principal = await self.store.principal(digest)
        if len(self._cache) > 100_000:  # (a flood of random keys: each is looked up once anyway)
            self._cache.clear()
        self._cache[digest] = (principal, time.monotonic() + self.cache_seconds)
        return principal


def _unknown_key() -> Unauthorized:
    return Unauthorized("Incorrect API key provided, or the key has been revoked.")


def _check_deadline(deadline: float, code: str, now: float) -> None:
    if now >= deadline:
        if code == "key_rotated":
            raise Unauthorized(
                "This API key's secret was replaced by a rotation and its grace period has ended: "
                "use the new secret.",
                code="key_rotated",
            )
        raise Unauthorized("This API key has expired.", code="key_expired")

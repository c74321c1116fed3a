"""One-time messages across a redirect (post/redirect/get), kept on the server: the clear key of a key
just created is shown once, on the page the form redirects to, and never again (a reload shows
nothing, and creates nothing).

A message is a row of ``console_flash`` on the store's database (any replica may serve the redirect),
read and deleted at once, and gone after ``TTL`` seconds if never read. Its text is encrypted with a
key derived from the console's secret and the session's CSRF token, which only the admin's signed
cookie carries: the row alone, or the database alone, does not give the key away. The cipher is
HMAC-SHA256 in counter mode with an HMAC-SHA256 tag over the ciphertext (encrypt-then-MAC).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from billing.store import Database

TTL = 120.0


def _key(secret: str, csrf: str, token: str) -> bytes:
    return hmac.new(secret.encode(), f"flash|{csrf}|{token}".encode(), hashlib.sha256).digest()


def _stream(key: bytes, size: int) -> bytes:
    blocks = (
        hmac.new(key, b"ctr" + n.to_bytes(8, "big"), hashlib.sha256).digest() for n in range(size // 32 + 1)
    )
    return b"".join(blocks)[:size]


def seal(secret: str, csrf: str, token: str, text: str) -> str:
    key = _key(secret, csrf, token)
    data = text.encode()
    box = bytes(a ^ b for a, b in zip(data, _stream(key, len(data)), strict=True))
    return (hmac.new(key, b"tag" + box, hashlib.sha256).digest() + box).hex()


def unseal(secret: str, csrf: str, token: str, sealed: str) -> str | None:
    key = _key(secret, csrf, token)
    try:
        raw = bytes.fromhex(sealed)
    except ValueError:
        return None
    tag, box = raw[:32], raw[32:]
    if not hmac.compare_digest(tag, hmac.new(key, b"tag" + box, hashlib.sha256).digest()):
        return None  # another session's message, or tampered with
    return bytes(a ^ b for a, b in zip(box, _stream(key, len(box)), strict=True)).decode()


async def put(db: Database, secret: str, csrf: str, text: str) -> str:
    """Keep ``text`` for the session with this CSRF token; the token to read it back with."""
    token = secrets.token_urlsafe(16)
    now = time.time()
    await db.write("DELETE FROM console_flash WHERE expires < ?", (now,))
    await db.write(
        "INSERT INTO console_flash (token, sealed, expires) VALUES (?, ?, ?)",
        (hashlib.sha256(token.encode()).hexdigest(), seal(secret, csrf, token, text), now + TTL),
    )
    return token


async def take(db: Database, secret: str, csrf: str, token: str) -> str | None:
    """The message, once: it is deleted as it is read (None if gone, expired or not this session's)."""
    name = hashlib.sha256(token.encode()).hexdigest()
    rows = await db.select("SELECT sealed, expires FROM console_flash WHERE token = ?", (name,))
    if not rows:
        return None
    counts = await db.atomic([("DELETE FROM console_flash WHERE token = ?", (name,))])
    if counts[0] != 1 or rows[0][1] < time.time():
        return None  # (another request took it first)
    return unseal(secret, csrf, token, str(rows[0][0]))

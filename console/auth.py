"""Who may use the console: the admin password (scrypt), the admin token, signed session cookies,
CSRF tokens bound to the session, and login throttling.

- **Password**: set by ``router console set-password``; only its scrypt hash is kept (in the console's
  own settings table, or ``[console] password_hash``). Format ``scrypt$n$r$p$salt$hash`` (base64).
- **Admin token**: ``[console] admin_token`` (or ``$ROUTER_CONSOLE_TOKEN``). It opens the admin JSON API
  (``Authorization: Bearer ...``) and is also accepted on the login form. An API key is never a login.
- **Sessions**: a cookie holding ``payload.signature`` (HMAC-SHA256 over the payload with the session
  secret). The payload says whether the session is logged in, when it expires, its CSRF token and, once
  logged in, its random id. Every visitor of the login page gets an anonymous session, so the login form
  has a CSRF token too. A logged-in session is also a row in the store (console/queries.py, by the
  SHA-256 of its id, with a fingerprint of the credentials it logged in with): logout deletes the row, so
  a copy of the cookie is worthless at once, on every replica; setting a new password (or changing
  ``password_hash`` or the admin token) ends every session, since their fingerprint no longer matches.
- **CSRF**: every form carries the session's token in a hidden field; a POST whose token does not
  match, or whose ``Origin`` is another site, is refused (403).
- **Throttling**: login attempts (and bad admin tokens) are counted over a sliding window, so that
  guessing is slow, without letting a guesser lock the real admin out:
  - the login form counts every attempt in the targeted account's window (every IP's and every
    device's attempts at that account) and in the client IP's window for that account, each *before*
    its credential is checked (gateway/attempts.py): past either limit it is refused (429) without the
    check (no scrypt work for a guesser), and guesses sent at once are bounded as guesses sent in turn
    are; a success gives its place back and starts its own count (that IP's or device's, for that
    account) again, never another account's. The count is shared by the replicas and outlives a
    restart (in Redis when ``[limits] redis_url`` is set, else in the store). A browser that has
    logged in as an account holds a signed *device cookie* naming that account (OWASP's defence
    against lockout attacks): its attempts at that account are counted on that device instead of its
    IP, so five bad tries from behind the same proxy do not lock out the account's own browser; they
    still count in the account's window, whose limit holds for every device (a cookie only ever
    lowers it), and a cookie earned on one account is nothing at another;
  - the admin API checks the token first (constant time, no scrypt) and lets a valid one through
    whatever the counts say; bad tokens are counted per IP in this process (:class:`Throttle`) and
    refused with 429 past the limit. A token must be at least ``MIN_TOKEN`` characters, so that
    guessing it is hopeless even unthrottled.
"""

from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass

from core.config import MIN_ADMIN_TOKEN, ConsoleSettings

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
MIN_TOKEN = MIN_ADMIN_TOKEN  # characters of an admin token (secrets.token_urlsafe(24) has 32)
DEVICE_SECONDS = 365 * 86400.0
MIN_PASSWORD = 8
MAX_PASSWORD = 1024
PASSWORD_SETTING = "admin_password"  # noqa: S105 (the name of a setting, not a password)
SECRET_SETTING = "session_secret"  # noqa: S105 (the name of a setting, not a secret)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# -- passwords ------------------------------------------------------------------------------------
def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def valid_hash(stored: str) -> bool:
    parts = stored.split("$")
    return len(parts) == 6 and parts[0] == "scrypt" and all(p.isdigit() for p in parts[1:4])


def verify_password(password: str, stored: str) -> bool:
    """Constant-time check of ``password`` against a ``hash_password`` string (False if malformed)."""
    if not valid_hash(stored) or len(password) > MAX_PASSWORD:
        return False
    _, n, r, p, salt, digest = stored.split("$")
    try:
        expected = _unb64(digest)
        got = hashlib.scrypt(
            password.encode(),
            salt=_unb64(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
            maxmem=256 * 1024 * 1024,
        )
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(got, expected)


def password_problem(password: str) -> str | None:
    if len(password) < MIN_PASSWORD:
        return f"The password must have at least {MIN_PASSWORD} characters."
    if len(password) > MAX_PASSWORD:
        return f"The password must have at most {MAX_PASSWORD} characters."
    return None


def admin_token(settings: ConsoleSettings) -> str:
    """The admin token ("" when none, or when $ROUTER_CONSOLE_TOKEN is too short to be one: the
    config's is checked when it is loaded)."""
    token = settings.admin_token or os.environ.get("ROUTER_CONSOLE_TOKEN", "")
    return token if len(token) >= MIN_TOKEN else ""


def token_matches(given: str, expected: str) -> bool:
    if not expected or not given:
        return False
    return hmac.compare_digest(
        hashlib.sha256(given.encode()).digest(), hashlib.sha256(expected.encode()).digest()
    )


# -- sessions -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Session:
    admin: bool
    csrf: str
    expires: float
    sid: str = ""  # a logged-in session's id (its SHA-256 is its row in the store)

    @staticmethod
    def anonymous(lifetime: float) -> Session:
        return Session(False, secrets.token_urlsafe(24), time.time() + lifetime)

    @staticmethod
    def logged_in(lifetime: float) -> Session:
        """A new session (new id, new CSRF token) for a successful login: nothing carries over."""
        return Session(True, secrets.token_urlsafe(24), time.time() + lifetime, secrets.token_urlsafe(24))

    @property
    def sid_hash(self) -> str:
        return hashlib.sha256(self.sid.encode()).hexdigest()


def fingerprint(password_hash: str, token: str) -> str:
    """What a session logged in against: a change of either credential ends it."""
    return hashlib.sha256(f"{password_hash}\0{token}".encode()).hexdigest()


def sign(data: dict[str, object], secret: str) -> str:
    payload = _b64(json.dumps(data).encode())
    mac = hmac.new(secret.encode(), payload.encode(), hashlib.sha256).digest()
    return f"{payload}.{_b64(mac)}"


def _number(value: object) -> float:
    """A number read from signed cookie data (a TypeError, like float(), for anything else)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"not a number: {value!r}")
    return float(value)


def signed(cookie: str | None, secret: str) -> dict[str, object] | None:
    """The data of a cookie made by ``sign``, if its signature holds."""
    if not cookie or len(cookie) > 4096 or "." not in cookie:
        return None
    payload, _, mac = cookie.partition(".")
    expected = hmac.new(secret.encode(), payload.encode(), hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(_unb64(mac), expected):
            return None
        data = json.loads(_unb64(payload))
    except (ValueError, binascii.Error):
        return None
    return data if isinstance(data, dict) else None


def sign_session(session: Session, secret: str) -> str:
    return sign({"a": session.admin, "c": session.csrf, "e": int(session.expires), "s": session.sid}, secret)


def new_device(secret: str, account: str) -> str:
    """A device cookie: this browser has logged in as ``account`` before (its failed logins at that
    account have a window of their own)."""
    return sign(
        {"d": secrets.token_urlsafe(16), "u": account, "e": int(time.time() + DEVICE_SECONDS)}, secret
    )


def read_device(cookie: str | None, secret: str, account: str) -> str | None:
    """The device id in a device cookie, if it is genuine, not expired, and for ``account`` (a cookie
    earned on one account is nothing at another)."""
    data = signed(cookie, secret)
    try:
        if data is None or _number(data["e"]) < time.time() or data.get("u") != account:
            return None
        return str(data["d"])
    except (KeyError, TypeError, ValueError):
        return None


def read_session(cookie: str | None, secret: str) -> Session | None:
    """The session in a cookie, if its signature holds and it has not expired."""
    data = signed(cookie, secret)
    if data is None:
        return None
    try:
        session = Session(bool(data["a"]), str(data["c"]), _number(data["e"]), str(data.get("s") or ""))
    except (ValueError, KeyError, TypeError):
        return None
    if session.expires < time.time() or not session.csrf or (session.admin and not session.sid):
        return None
    return session


def csrf_ok(session: Session | None, token: str | None) -> bool:
    return (
        session is not None
        and bool(token)
        and hmac.compare_digest(session.csrf.encode(), (token or "").encode())
    )


# -- throttling -----------------------------------------------------------------------------------
class Throttle:
    """Failed attempts per key (a client IP) and overall, in a sliding window, in this process (the
    admin API's bad tokens). Attempts with ``overall=False`` neither count toward nor wait for the
    overall limit."""

    MAX_IPS = 10_000

    def __init__(self, per_ip: int, overall: int, window: float) -> None:
        self.per_ip = per_ip
        self.overall = overall
        self.window = window
        self._ips: dict[str, collections.deque[float]] = {}
        self._all: collections.deque[float] = collections.deque()

    def _prune(self, attempts: collections.deque[float], now: float) -> None:
        while attempts and attempts[0] <= now - self.window:
            attempts.popleft()

    def retry_after(self, ip: str, overall: bool = True) -> int | None:
        """Seconds to wait if ``ip`` (or everyone) is throttled now, else None."""
        now = time.monotonic()
        self._prune(self._all, now)
        waits: list[float] = []
        if overall and len(self._all) >= self.overall:
            waits.append(self._all[-self.overall] + self.window - now)
        mine = self._ips.get(ip)
        if mine is not None:
            self._prune(mine, now)
            if len(mine) >= self.per_ip:
                waits.append(mine[-self.per_ip] + self.window - now)
            elif not mine:
                del self._ips[ip]
        return max(1, int(max(waits)) + 1) if waits else None

    def failed(self, ip: str, overall: bool = True) -> None:
        now = time.monotonic()
        if len(self._ips) >= self.MAX_IPS and ip not in self._ips:
            for other in list(self._ips):
                self._prune(self._ips[other], now)
                if not self._ips[other]:
                    del self._ips[other]
            if len(self._ips) >= self.MAX_IPS:
                self._ips.pop(next(iter(self._ips)))
        self._ips.setdefault(ip, collections.deque()).append(now)
        if overall:
            self._all.append(now)
        while len(self._all) > self.overall * 2:
            self._all.popleft()

    def succeeded(self, ip: str) -> None:
        self._ips.pop(ip, None)

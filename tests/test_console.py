"""The management console (/console) and its admin JSON API, over real HTTP on loopback: every page
and form needs a login, every form its CSRF token; validation errors come back on the form; logins are
throttled; the JSON API needs the admin token. The history queries are checked on both stores
(PostgreSQL in a database of its own) and on a million rows."""

from __future__ import annotations

import asyncio
import http.client
import io
import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import openai
import pytest
import redis

from billing.history import Filter, History
from billing.sqlite import SQLiteStore
from billing.sqlite_thread import SQLiteThread
from billing.store import Reservation, Store, UsageRecord
from cli.console import store_password
from console import auth
from console.app import Console
from console.queries import Queries, queries_for
from core.catalog import ConfigError
from core.config import (
    ConsoleSettings,
    JobsSettings,
    LimitsSettings,
    ReliabilitySettings,
    Settings,
    StoreSettings,
    parse_settings,
)
from gateway.attempts import Attempts, Window
from tests.conftest import REDIS_URL, Raw, Stack, free_port

TOKEN = "admin-token-for-tests-0123456789"
PASSWORD = "correct horse battery"
MODEL = "openai/gpt-4o-mini"
HI: Any = [{"role": "user", "content": "hi"}]
COLUMNS = (
    "ts, key_id, group_id, model, provider, endpoint, source, stream, prompt_tokens, completion_tokens, "
    "cached_tokens, cache_write_tokens, reasoning_tokens, credits, status, usage_exact, latency_ms, ttft_ms, "
    "upstream_request_id, request_id, error"
)


# -- helpers (the browser tests use them too) -----------------------------------------------------
def console_stack(tmp: Path, **console: Any) -> Stack:
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp}/router.db"),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
        console=ConsoleSettings(admin_token=TOKEN, **console),
        jobs=JobsSettings(poll_interval=0.05, concurrency=4, stop_grace=1.0),
    )
    stack = Stack(tmp, settings).start()
    stack.run(store_password(stack.store, auth.hash_password(PASSWORD)))
    return stack


def console_of(stack: Stack) -> Console:
    for route in stack.app.routes:
        if getattr(route, "path", "") == "/console":
            console: Console = route.app.state.console  # type: ignore[attr-defined]
            return console
    raise AssertionError("no /console mount")


def job_record(
    stack: Stack, group: str, key_id: int, model: str = MODEL, credits: int = 1234, **kw: Any
) -> None:
    """A usage record with source=job, settled through the store (as the ledger settles a job's line)."""

    async def go() -> None:
        g = await stack.store.get_group(group)
        assert g is not None
        reservation = Reservation(-1, g.id, key_id, credits)  # (held in the gateway's memory: none stored)
        record = UsageRecord(
            key_id=key_id,
            group_id=g.id,
            model=model,
            provider=model.split("/")[0],
            source="job",
            prompt_tokens=11,
            completion_tokens=7,
            credits=credits,
            latency_ms=12.0,
            **kw,
        )
        await stack.store.settle(reservation, record)  # type: ignore[arg-type]

    stack.run(go())


class Client:
    """A cookie-keeping HTTP client for the console (stdlib http.client)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.cookies: dict[str, str] = {}

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Raw:
        conn = http.client.HTTPConnection("127.0.0.1", self.stack.port, timeout=30)
        try:
            sent = dict(headers or {})
            if self.cookies:
                sent["cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            conn.request(method, path, body=body, headers=sent)
            resp = conn.getresponse()
            for name, value in resp.getheaders():
                if name.lower() == "set-cookie":
                    for morsel in SimpleCookie(value).values():
                        if morsel.value and morsel["max-age"] != "0":
                            self.cookies[morsel.key] = morsel.value
                        else:
                            self.cookies.pop(morsel.key, None)
            return Raw(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def get(self, path: str) -> Raw:
        return self.request("GET", path)

    def post(
        self,
        path: str,
        fields: dict[str, str],
        csrf: str | None = "auto",
        headers: dict[str, str] | None = None,
    ) -> Raw:
        data = dict(fields)
        if csrf == "auto":
            data["csrf"] = self.csrf()
        elif csrf is not None:
            data["csrf"] = csrf
        body = urlencode(data).encode()
        return self.request(
            "POST", path, body, {"content-type": "application/x-www-form-urlencoded", **(headers or {})}
        )

    def csrf(self, path: str = "/console/groups") -> str:
        page = self.get(path)
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found, page.text[:500]
        return found.group(1)

    def login(self, password: str = PASSWORD, name: str = "") -> Raw:
        self.get("/console/login")
        return self.post(
            "/console/login", {"name": name, "password": password}, csrf=self.csrf("/console/login")
        )

    def api(self, method: str, path: str, data: Any = None, token: str | None = TOKEN) -> Raw:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        body = None
        if data is not None:
            body = json.dumps(data).encode()
            headers["content-type"] = "application/json"
        return self.request(method, "/console/api" + path, body, headers)


def admin(stack: Stack) -> Client:
    client = Client(stack)
    assert client.login().status == 303
    return client


@pytest.fixture(scope="module")
def cstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = console_stack(tmp_path_factory.mktemp("console"), login_attempts_per_ip=3)
    try:
        yield s
    finally:
        s.stop()


def forget_failures(stack: Stack) -> None:
    """Forget this machine's failed logins and bad admin tokens, so that a test leaves none to the next
    (the logins' count is in the store: gateway/attempts.py; the tokens' in the console's memory)."""
    console = console_of(stack)
    console.throttle.succeeded("127.0.0.1")
    stack.run(console.gateway.attempts.clear(console.login_windows("127.0.0.1")))


@pytest.fixture
def web(cstack: Stack) -> Iterator[Client]:
    forget_failures(cstack)
    yield admin(cstack)
    cstack.close_clients()


def texts(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


# -- login, sessions, CSRF, throttling ------------------------------------------------------------
GET_PAGES = [
    "/console/",
    "/console/groups",
    "/console/groups/{g}",
    "/console/groups/{g}/keys",
    "/console/groups/{g}/calls",
    "/console/groups/{g}/calls.csv",
    "/console/groups/{g}/usage",
    "/console/keys",
    "/console/keys/{k}",
    "/console/keys/{k}/revoke",
    "/console/calls?request=x",
    "/console/calls/1",
    "/console/batches",
    "/console/batches/batch_x",
    "/console/display",
]
FORMS = [
    "/console/groups",
    "/console/groups/{g}/topup",
    "/console/groups/{g}/keys",
    "/console/keys/{k}/update",
    "/console/keys/{k}/revoke",
    "/console/batches/batch_x/cancel",
    "/console/display",
    "/console/logout",
]


def test_every_page_and_form_needs_a_login(cstack: Stack) -> None:
    group = cstack.group(10)
    key = cstack.key(group=group)
    key_id = cstack.run(cstack.store.list_keys(group))[0].id
    anon = Client(cstack)
    for path in GET_PAGES:
        r = anon.get(path.format(g=group, k=key_id))
        assert r.status == 303, path
        assert r.headers["location"].startswith("/console/login?next="), path
    anon.get("/console/login")  # an anonymous session and its token do not make a login
    token = anon.csrf("/console/login")
    for path in FORMS:
        r = anon.post(
            path.format(g=group, k=key_id), {"name": "intruder", "amount": "5", "credits": "5"}, csrf=token
        )
        assert r.status == 303 and "/console/login" in r.headers["location"], path
    assert cstack.run(cstack.store.get_group("intruder")) is None
    assert cstack.run(cstack.store.get_group(group)).balance == 10 * 10**9  # type: ignore[union-attr]
    assert not cstack.run(cstack.store.list_keys(group))[0].revoked_at
    # an API key is not a console login, nor an admin token
    assert anon.post("/console/login", {"password": key}, csrf=token).status == 401
    assert anon.api("GET", "/groups", token=key).status == 401
    assert anon.get("/console/groups").status == 303
    forget_failures(cstack)


def test_login_logout_and_a_forged_cookie(cstack: Stack) -> None:
    web = Client(cstack)
    login = web.get("/console/login")
    assert login.status == 200 and "the admin password or token" in login.text and "Operator" in login.text
    assert "content-security-policy" in login.headers and login.headers["x-frame-options"] == "DENY"
    wrong = web.post("/console/login", {"password": "not it at all"}, csrf=web.csrf("/console/login"))
    assert wrong.status == 401 and "Wrong name or password." in wrong.text
    ok = web.post(
        "/console/login",
        {"password": PASSWORD, "next": "/console/groups?x=1"},
        csrf=web.csrf("/console/login"),
    )
    assert ok.status == 303 and ok.headers["location"] == "/console/groups?x=1"
    cookie = ok.headers["set-cookie"]
    assert (
        "HttpOnly" in cookie
        and "SameSite=strict" in cookie.replace("Strict", "strict")
        and "Path=/console" in cookie
    )
    page = web.get("/console/groups")
    assert (
        page.status == 200 and "<h1>Groups</h1>" in page.text and page.headers["cache-control"] == "no-store"
    )
    # an off-site "next" is not followed
    other = Client(cstack)
    other.get("/console/login")
    assert (
        other.post(
            "/console/login",
            {"password": PASSWORD, "next": "https://evil.example/"},
            csrf=other.csrf("/console/login"),
        ).headers["location"]
        == "/console/"
    )
    # the admin token logs in too
    tok = Client(cstack)
    tok.get("/console/login")
    assert tok.post("/console/login", {"password": TOKEN}, csrf=tok.csrf("/console/login")).status == 303
    # a tampered cookie is no session
    forged = Client(cstack)
    value = web.cookies["mr_console"]
    payload, mac = value.split(".")
    forged.cookies["mr_console"] = payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB") + "." + mac
    assert forged.get("/console/groups").status == 303
    # log out: the cookie goes, the pages are closed again
    out = web.post("/console/logout", {})
    assert out.status == 303 and out.headers["location"] == "/console/login"
    assert "mr_console" not in web.cookies
    assert web.get("/console/groups").status == 303


def test_logout_ends_the_session_on_the_server(cstack: Stack) -> None:
    """A copy of the cookie taken before logout (a shared machine, a proxy log) opened the console for
    the rest of its 8 hours; the session is a row in the store, and logout deletes it."""
    web = admin(cstack)
    copy = Client(cstack)
    copy.cookies = dict(web.cookies)
    assert copy.get("/console/groups").status == 200
    assert web.post("/console/logout", {}).status == 303
    assert copy.get("/console/groups").status == 303  # the replayed cookie opens nothing
    assert copy.post("/console/groups", {"name": "after-logout", "credits": "1"}, csrf=None).status in (
        303,
        403,
    )
    assert cstack.run(cstack.store.get_group("after-logout")) is None


def test_a_new_password_ends_sessions_signed_with_a_configured_secret(tmp_path: Path) -> None:
    """With [console] session_secret set, rotating the stored secret changed nothing: the old cookie
    stayed valid after a password change. The sessions' rows end with the credentials they used."""
    stack = console_stack(tmp_path, session_secret="a-fixed-secret-for-every-replica-0123")
    try:
        web = admin(stack)
        assert web.get("/console/groups").status == 200
        stack.run(store_password(stack.store, auth.hash_password("another password 42")))
        console_of(stack).forget()  # the password hash is cached a few seconds
        assert web.get("/console/groups").status == 303
    finally:
        stack.stop()


def test_a_new_password_ends_every_session(cstack: Stack) -> None:
    web = admin(cstack)
    assert web.get("/console/groups").status == 200
    try:
        cstack.run(store_password(cstack.store, auth.hash_password("another password 42")))
        console_of(cstack).forget()  # else within a few seconds (the credentials are cached)
        assert web.get("/console/groups").status == 303
        assert Client(cstack).login().status == 401
        assert Client(cstack).login("another password 42").status == 303
    finally:
        cstack.run(store_password(cstack.store, auth.hash_password(PASSWORD)))
        console_of(cstack).forget()
        forget_failures(cstack)


def test_csrf_is_enforced_on_every_form(cstack: Stack, web: Client) -> None:
    group = cstack.group(5)
    cstack.key(group=group)
    key_id = cstack.run(cstack.store.list_keys(group))[0].id
    fields = {"name": "csrf-victim", "credits": "1", "amount": "1", "label": "x", "spend_cap": "1"}
    for path in FORMS:
        path = path.format(g=group, k=key_id)
        for token in (None, "", "wrong-token"):
            r = web.post(path, fields, csrf=token)
            assert r.status == 403 and "security token" in r.text, (path, token)
        cross = web.post(path, fields, headers={"origin": "http://evil.example"})
        assert cross.status == 403, path
    assert web.post("/console/groups", fields, headers={"content-type": "text/plain"}).status in (400, 403)
    assert cstack.run(cstack.store.get_group("csrf-victim")) is None
    assert cstack.run(cstack.store.get_group(group)).balance == 5 * 10**9  # type: ignore[union-attr]
    assert not cstack.run(cstack.store.list_keys(group))[0].revoked_at
    assert web.get("/console/groups").status == 200  # still logged in
    # the login form has its token too
    anon = Client(cstack)
    anon.get("/console/login")
    assert anon.post("/console/login", {"password": PASSWORD}, csrf="nope").status == 403
    assert anon.post("/console/login", {"password": PASSWORD}, csrf=None).status == 403
    assert anon.get("/console/groups").status == 303


def test_login_is_throttled(cstack: Stack) -> None:
    try:
        web = Client(cstack)
        web.get("/console/login")
        for _ in range(3):
            assert (
                web.post(
                    "/console/login", {"password": "bad password"}, csrf=web.csrf("/console/login")
                ).status
                == 401
            )
        blocked = web.post("/console/login", {"password": PASSWORD}, csrf=web.csrf("/console/login"))
        assert blocked.status == 429 and "Too many failed logins" in blocked.text
        assert int(blocked.headers["retry-after"]) > 0
        assert (
            web.get("/console/groups").status == 303
        )  # a browser never logged in before: not even the right one
        assert (
            web.api("GET", "/groups", token="wrong-token").status == 401
        )  # (the API counts its bad tokens apart)
    finally:
        forget_failures(cstack)
    assert admin(cstack).get("/console/groups").status == 200


def test_a_lockout_from_the_same_ip_does_not_lock_out_the_admin(cstack: Stack) -> None:
    """Failed logins were counted per IP and checked before the credential, so five bad tries from
    behind the admin's own proxy locked the admin out for five minutes. The admin's browser (it has
    logged in before: a signed device cookie) and the admin token on the API still get in."""
    console = console_of(cstack)
    browser = admin(cstack)  # logged in once: it holds the device cookie
    assert "mr_console_device" in browser.cookies
    assert browser.post("/console/logout", {}).status == 303
    try:
        attacker = Client(cstack)
        attacker.get("/console/login")
        for _ in range(3):
            attacker.post("/console/login", {"password": "guess"}, csrf=attacker.csrf("/console/login"))
        assert attacker.login().status == 429  # the IP is locked (3 attempts per IP in this stack)
        for _ in range(3):
            assert attacker.api("GET", "/groups", token="guess-" + "x" * 30).status in (401, 429)
        assert browser.login().status == 303  # the admin's browser gets in
        assert browser.get("/console/groups").status == 200
        assert Client(cstack).api("GET", "/groups").status == 200  # and the valid token does
        # the device counts its own failures: its bad tries lock it, and only it
        browser.post("/console/logout", {})
        for _ in range(3):
            assert browser.login("not the password").status == 401
        assert browser.login().status == 429
    finally:
        console.throttle._ips.clear()
        console.throttle._all.clear()
        forget_failures(cstack)
    assert admin(cstack).get("/console/groups").status == 200


def test_throttle_per_ip_overall_and_window(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: now[0])
    t = auth.Throttle(per_ip=2, overall=3, window=60)
    t.failed("a")
    assert t.retry_after("a") is None
    t.failed("a")
    assert t.retry_after("a") == 61 and t.retry_after("b") is None
    t.failed("b")
    assert t.retry_after("c") is not None  # three failures overall: everyone waits
    now[0] += 61
    assert t.retry_after("a") is None and t.retry_after("c") is None
    t.failed("a")
    t.succeeded("a")
    assert t.retry_after("a") is None


# -- login attempts counted before the check, shared, kept over a restart ----------------------------------
def login_stack(tmp: Path, url: str, redis_url: str = "", prefix: str = "", **console: Any) -> Stack:
    """A console on the store at ``url`` (and its logins counted in Redis with ``redis_url``). Redis is
    given 2 s a check, not the default 0.25 s: on a loaded test machine a slow check counts in the store
    instead (by design), and each replica would then count on its own."""
    settings = Settings(
        store=StoreSettings(url=url, journal=str(tmp / "journal.jsonl")),
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
        limits=LimitsSettings(redis_url=redis_url, redis_prefix=prefix, redis_timeout=2.0),
        console=ConsoleSettings(admin_token=TOKEN, **console),
    )
    stack = Stack(tmp, settings).start()
    stack.run(store_password(stack.store, auth.hash_password(PASSWORD)))
    return stack


class Checks:
    """Counts the password checks (scrypt) of every console in this process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        lock = threading.Lock()  # (the checks run on worker threads)
        verify = auth.verify_password

        def counted(password: str, stored: str) -> bool:
            with lock:
                self.count += 1
            return verify(password, stored)

        monkeypatch.setattr(auth, "verify_password", counted)


def guesses(stacks: list[Stack], n: int, password: str = "wrong guess 1") -> list[int]:
    """``n`` logins sent at once, spread over ``stacks``, each from a browser that never logged in:
    their statuses."""
    forms = []
    for stack in stacks:
        browser = Client(stack)
        browser.get("/console/login")
        forms.append((stack, browser.csrf("/console/login"), browser.cookies))

    async def send() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as client:
            posts = []
            for i in range(n):
                stack, csrf, cookies = forms[i % len(forms)]
                posts.append(
                    client.post(
                        f"http://127.0.0.1:{stack.port}/console/login",
                        data={"password": password, "csrf": csrf},
                        headers={"cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())},
                    )
                )
            answers = await asyncio.gather(*posts)
        return [answer.status_code for answer in answers]

    return asyncio.run(send())


@pytest.mark.parametrize(("per_ip", "overall"), [(5, 50), (50, 5)])
def test_guesses_sent_at_once_are_counted_before_they_are_checked(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_ip: int, overall: int
) -> None:
    """40 wrong passwords sent at once: the failures were counted after the check, so all 40 were
    checked (scrypt each) before the first was counted. Now an attempt takes its place in its IP's and
    the account's windows first: 5 are checked, 35 refused (429) unchecked, whichever limit binds. The
    count is in the store: a restarted console still refuses, even the right password."""
    checks = Checks(monkeypatch)
    stack = login_stack(
        tmp_path / "a", store_url, login_attempts_per_ip=per_ip, login_attempts_global=overall
    )
    try:
        statuses = guesses([stack], 40)
    finally:
        stack.stop()
    assert sorted(set(statuses)) == [401, 429] and statuses.count(401) == checks.count == 5, (
        checks.count,
        statuses,
    )

    again = login_stack(
        tmp_path / "b", store_url, login_attempts_per_ip=per_ip, login_attempts_global=overall
    )
    try:
        refused = Client(again).login()
        assert refused.status == 429 and int(refused.headers["retry-after"]) > 250  # (300 s window)
        assert checks.count == 5
    finally:
        again.stop()


def test_login_attempts_are_shared_through_redis_by_replicas_and_kept_over_a_restart(
    pg: Any, tmp_path: Path, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two consoles on one store and one Redis: guesses sent at once to both are counted once (each
    process counted its own: a second replica accepted five more, and a restart cleared the count);
    a restarted one still refuses."""
    checks = Checks(monkeypatch)
    url = pg.fresh_url()
    stacks = [login_stack(tmp_path / name, url, REDIS_URL, redis_prefix) for name in ("one", "two")]
    try:
        statuses = guesses(stacks, 40)
        assert statuses.count(401) == checks.count == 5 and statuses.count(429) == 35, (
            checks.count,
            statuses,
        )
        assert [Client(stack).login().status for stack in stacks] == [429, 429] and checks.count == 5
        with redis.Redis.from_url(REDIS_URL) as shared:
            assert shared.keys(f"{redis_prefix}{{attempts}}:login:*")  # counted in Redis
        stacks.pop(0).stop()
        stacks.append(login_stack(tmp_path / "restarted", url, REDIS_URL, redis_prefix))
        assert Client(stacks[-1]).login().status == 429 and checks.count == 5
    finally:
        for stack in stacks:
            stack.stop()


async def test_login_attempts_are_counted_in_the_store_while_redis_cannot_be_reached(tmp_path: Path) -> None:
    """Redis configured but unreachable (a port nobody listens on): the attempts are counted in the store
    meanwhile, neither let through uncounted nor refused for the loss of a counter."""
    db = SQLiteThread(str(tmp_path / "router.db"))
    await db.open()
    attempts = Attempts(db, f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
    try:
        windows = [Window("login:ip:192.0.2.1", 2)]
        taken = [await attempts.take(windows, 300) for _ in range(3)]
        assert [a.wait for a in taken][:2] == [0, 0] and taken[2].wait > 250 and taken[0].stored
        await attempts.give_back(taken[0], windows)
        assert (await attempts.take(windows, 300)).wait == 0
    finally:
        await attempts.close()
        await db.close()


def test_sessions_and_passwords() -> None:
    hashed = auth.hash_password(PASSWORD)
    assert hashed.startswith("scrypt$") and PASSWORD not in hashed
    assert auth.verify_password(PASSWORD, hashed) and not auth.verify_password(PASSWORD + "x", hashed)
    assert not auth.verify_password(PASSWORD, "scrypt$1$2$3$!!$!!") and not auth.verify_password("x", "plain")
    s = auth.Session.logged_in(60)
    cookie = auth.sign_session(s, "secret")
    assert auth.read_session(cookie, "secret") == auth.Session(True, s.csrf, float(int(s.expires)), s.sid)
    assert (
        auth.read_session(auth.sign_session(auth.Session(True, "c", time.time() + 60), "secret"), "secret")
        is None
    )  # no id
    assert auth.read_session(cookie, "other secret") is None
    assert (
        auth.read_session(auth.sign_session(auth.Session(True, "c", time.time() - 1), "secret"), "secret")
        is None
    )
    assert auth.read_session("garbage", "secret") is None and auth.read_session("a.b", "secret") is None
    assert auth.csrf_ok(s, s.csrf) and not auth.csrf_ok(s, "x") and not auth.csrf_ok(None, s.csrf)


def test_config_console_table() -> None:
    s = parse_settings({"console": {"admin_token": TOKEN, "session_seconds": 60, "login_attempts_per_ip": 2}})
    assert s.console.admin_token == TOKEN and s.console.session_seconds == 60
    with pytest.raises(ConfigError, match="at least 24 characters"):
        parse_settings(
            {"console": {"admin_token": "short"}}
        )  # a valid token always gets in: no guessable one
    with pytest.raises(ConfigError, match="console"):
        parse_settings({"console": {"admin_tokn": "t"}})
    with pytest.raises(ConfigError):
        parse_settings({"console": {"login_attempts_per_ip": 0}})


def test_cli_sets_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    config = tmp_path / "router.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/cli.db"\n')
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    with pytest.raises(SystemExit, match="at least 8"):
        main(["--config", str(config), "console", "set-password", "--stdin"])
    monkeypatch.setattr("sys.stdin", io.StringIO("a much longer password\n"))
    main(["--config", str(config), "console", "set-password", "--stdin"])
    assert "console password set" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("a much longer password\n"))
    main(["--config", str(config), "console", "hash-password", "--stdin"])
    printed = capsys.readouterr().out.strip()
    assert auth.verify_password("a much longer password", printed)

    async def stored() -> tuple[str | None, str | None]:
        store = SQLiteStore(f"sqlite:///{tmp_path}/cli.db")
        await store.open()
        try:
            q = queries_for(store)
            return await q.get_setting(auth.PASSWORD_SETTING), await q.get_setting(auth.SECRET_SETTING)
        finally:
            await store.close()

    hashed, secret = asyncio.run(stored())
    assert hashed and auth.verify_password("a much longer password", hashed) and secret


# -- the admin JSON API ---------------------------------------------------------------------------
def test_admin_api(cstack: Stack) -> None:
    api = Client(cstack)
    assert api.api("GET", "/groups", token=None).status == 401
    assert api.api("GET", "/groups", token="wrong").status == 401
    console_of(cstack).throttle.succeeded("127.0.0.1")
    r = api.api("POST", "/groups", {"name": "api-team", "credits": "10.25"})
    assert r.status == 201 and r.json()["balance"] == "10.25" and r.json()["balance_nano"] == 10_250_000_000
    assert api.api("POST", "/groups", {"name": "api-team", "credits": 1}).status == 400
    bad = api.api("POST", "/groups", {"name": "x y", "credits": 1})
    assert bad.status == 400 and bad.json()["error"]["param"] == "name"
    assert api.api("POST", "/groups/api-team/topup", {"credits": 0.75}).json()["balance"] == "11"
    assert api.api("POST", "/groups/api-team/topup", {"credits": "-1"}).status == 400
    assert (
        api.request(
            "POST",
            "/console/api/groups",
            b"{",
            {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
        ).status
        == 400
    )
    assert any(g["name"] == "api-team" for g in api.api("GET", "/groups").json()["groups"])
    assert api.api("GET", "/groups/none-such").status == 404
    created = api.api(
        "POST", "/groups/api-team/keys", {"name": "bot", "spend_cap": "5", "allowed_models": [MODEL]}
    )
    assert created.status == 201
    key, key_id = created.json()["key"], created.json()["id"]
    assert created.json()["spend_cap"] == "5" and created.json()["allowed_models"] == [MODEL]
    assert "key" not in api.api("GET", f"/keys/{key_id}").json()
    client = cstack.client(key)
    client.chat.completions.create(model=MODEL, messages=HI)
    usage = api.api("GET", "/groups/api-team/usage?source=api").json()
    assert len(usage["data"]) == 1 and usage["data"][0]["model"] == MODEL and usage["older"] is None
    assert api.api("GET", "/groups/api-team/usage?source=job").json()["data"] == []
    assert api.api("GET", "/groups/api-team/usage?source=nope").status == 400
    buckets = api.api("GET", "/groups/api-team/usage/buckets?width=3600").json()["buckets"]
    assert sum(b["calls"] for b in buckets) == 1
    models = api.api("GET", f"/keys/{key_id}/usage").json()["models"]
    assert models[0]["model"] == MODEL and models[0]["calls"] == 1
    patched = api.api("PATCH", f"/keys/{key_id}", {"allowed_models": None, "spend_cap": None})
    assert (
        patched.status == 200
        and patched.json()["allowed_models"] is None
        and patched.json()["spend_cap"] is None
    )
    assert api.api("PATCH", f"/keys/{key_id}", {"colour": "red"}).status == 400
    assert api.api("PATCH", f"/keys/{key_id}", {"allowed_models": ["zz/none"]}).status == 400
    assert api.api("GET", "/groups/api-team/keys").json()["keys"][0]["id"] == key_id
    assert api.api("POST", f"/keys/{key_id}/revoke").json()["revoked"] is True
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model=MODEL, messages=HI)
    assert api.api("GET", "/keys/424242").status == 404
    # a console login is not an API credential
    web = admin(cstack)
    web_api = web.request("GET", "/console/api/groups")
    assert web_api.status == 401


def test_admin_api_off_without_a_token(stack: Stack) -> None:
    r = Client(stack).api("GET", "/groups", token="anything")
    assert r.status == 403 and r.json()["error"]["code"] == "admin_api_disabled"
    login = Client(stack).get("/console/login")
    assert "No admin password is set yet" in login.text


# -- queries: both stores, a million rows ---------------------------------------------------------
def seed(
    rows: int, groups: int = 2, jobs_every: int = 10, start: float = 1_700_000_000.0, step: float = 1.0
) -> list[tuple[Any, ...]]:
    models = [MODEL, "anthropic/claude-sonnet-4-6", "mistral/mistral-small-latest"]
    return [
        (
            start + i * step,
            1 + i % 4,
            1 + i % groups,
            models[i % 3],
            models[i % 3].split("/")[0],
            "chat",
            "job" if i % jobs_every == 0 else "api",
            0,
            10 + i % 7,
            5 + i % 5,
            0,
            0,
            0,
            1000 + i,
            "ok",
            1,
            12.5,
            None,
            None,
            None,
            None,
        )
        for i in range(rows)
    ]


async def check_queries(store: Store) -> dict[str, Any]:
    """The same questions on any store seeded with ``seed(500)``; the answers, to compare stores."""
    q: History = store.history
    settings: Queries = queries_for(store)
    out: dict[str, Any] = {}
    start = 1_700_000_000.0
    all_pages: list[int] = []
    before = None
    for _ in range(20):
        page = await q.history(Filter(1), 40, before=before)
        all_pages += [r.id for r in page.rows]
        if page.older is None:
            break
        before = page.older
    assert len(all_pages) == 250 and all_pages == sorted(all_pages, reverse=True)
    page = await q.history(Filter(1), 40, before=all_pages[79])
    assert page.newer == all_pages[80] and page.older is not None
    back = await q.history(Filter(1), 40, after=page.newer)
    assert [r.id for r in back.rows] == all_pages[40:80]
    jobs = await q.history(Filter(1, source="job"), 100)
    assert {r.source for r in jobs.rows} == {"job"} and len(jobs.rows) == 50
    window = await q.history(Filter(1, since=start + 100, until=start + 200), 100)
    assert all(start + 100 <= r.ts < start + 200 for r in window.rows) and len(window.rows) == 50
    combo = await q.history(
        Filter(1, source="api", model=MODEL, key_id=1, since=start, until=start + 300), 100
    )
    assert all(r.key_id == 1 and r.model == MODEL and r.source == "api" for r in combo.rows)
    out["combo"] = [r.id for r in combo.rows]
    buckets = await q.buckets(Filter(1), start, 100.0, 5)
    assert sum(b.calls for b in buckets) == 250 and buckets[0].calls == 50
    out["buckets"] = [(b.calls, b.credits) for b in buckets]
    rows = await q.key_models(1, 1, start, start + 500)
    out["models"] = [(r.name, r.calls, r.prompt_tokens, r.completion_tokens, r.credits) for r in rows]
    exported = [r.id async for chunk in q.export(Filter(1, source="job"), 1000, chunk=7) for r in chunk]
    assert len(exported) == 50
    assert (
        await settings.setting_or_default("x", "first") == "first"
        and await settings.setting_or_default("x", "2nd") == "first"
    )
    await settings.set_setting("x", "third")
    assert await settings.get_setting("x") == "third" and await settings.get_setting("nothing") is None
    return out


def test_queries_on_sqlite_and_postgres(tmp_path: Path) -> None:
    import secrets

    import asyncpg

    from billing.postgres import PostgresStore

    data = seed(500)

    async def on_sqlite() -> dict[str, Any]:
        store = SQLiteStore(f"sqlite:///{tmp_path}/q.db")
        await store.open()
        try:
            await store.run(
                lambda db: db.executemany(
                    f"INSERT INTO usage ({COLUMNS}) VALUES ({', '.join('?' * 21)})",
                    data,
                )
            )
            return await check_queries(store)
        finally:
            await store.close()

    async def on_postgres() -> dict[str, Any]:
        admin_url = "postgresql://postgres@127.0.0.1:5432/postgres"
        name = f"console_test_{secrets.token_hex(4)}"
        conn = await asyncpg.connect(admin_url, timeout=10)
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()
        store = PostgresStore(f"postgresql://postgres@127.0.0.1:5432/{name}")
        try:
            await store.open()
            pg = [(*r[:7], bool(r[7]), *r[8:15], bool(r[15]), *r[16:]) for r in data]
            async with store.db.connection() as conn:
                await conn.executemany(
                    f"INSERT INTO usage ({COLUMNS}) VALUES ({', '.join(f'${n}' for n in range(1, 22))})", pg
                )
            result = await check_queries(store)
            indexes = await store.database.select(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'usage'"
            )
            assert {"usage_group_source", "usage_group_model", "usage_key"} <= {r[0] for r in indexes}
            return result
        finally:
            await store.close()
            conn = await asyncpg.connect(admin_url, timeout=10)
            try:
                await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            finally:
                await conn.close()

    assert asyncio.run(on_sqlite()) == asyncio.run(on_postgres())


@pytest.mark.slow  # (seconds of its own: not in make test-fast)
def test_history_stays_fast_with_a_million_rows(tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    now = time.time()
    n = 1_000_000
    store = SQLiteStore(f"sqlite:///{path}")
    asyncio.run(store.open())
    asyncio.run(store.close())
    db = sqlite3.connect(path)
    try:  # a million calls, one a second up to now; one in 5000 from a job
        db.executemany(
            f"INSERT INTO usage ({COLUMNS}) VALUES "
            "(?, ?, 1, ?, 'p', 'chat', ?, 0, 10, 5, 0, 0, 0, 100, 'ok', 1, 10.0, NULL, NULL, NULL, NULL)",
            (
                (
                    now - n + i,
                    1 + i % 50,
                    "rare/model" if i % 100_000 == 7 else MODEL,
                    "job" if i % 5000 == 0 else "api",
                )
                for i in range(n)
            ),
        )
        db.commit()
    finally:
        db.close()

    async def measure() -> dict[str, float]:
        await store.open()
        try:
            q = store.history
            timings: dict[str, float] = {}

            async def timed(name: str, coro: Any) -> Any:
                began = time.perf_counter()
                result = await coro
                timings[name] = time.perf_counter() - began
                return result

            first = await timed("first page", q.history(Filter(1), 50))
            assert len(first.rows) == 50 and first.older is not None
            deep = await timed("deep page", q.history(Filter(1), 50, before=1000))
            assert [r.id for r in deep.rows] == list(range(999, 949, -1))
            jobs = await timed("jobs", q.history(Filter(1, source="job"), 50, before=300_000))
            assert len(jobs.rows) == 50 and all(r.source == "job" for r in jobs.rows)
            rare = await timed("rare model", q.history(Filter(1, model="rare/model"), 50))
            assert len(rare.rows) == 10
            key = await timed("key", q.history(Filter(1, key_id=7), 50, before=500_000))
            assert len(key.rows) == 50
            old = await timed(
                "old period", q.history(Filter(1, since=now - n + 1000, until=now - n + 2000), 50)
            )
            assert len(old.rows) == 50 and all(now - n + 1000 <= r.ts < now - n + 2000 for r in old.rows)
            day = await timed("chart 24h", q.buckets(Filter(1), now - 86400, 3600, 24))
            assert sum(b.calls for b in day) in (86399, 86400, 86401)
            models = await timed("key models 1h", q.key_models(7, 1, now - 3600, None))
            assert sum(m.calls for m in models) == 72
            return timings
        finally:
            await store.close()

    timings = asyncio.run(measure())
    slow = {name: round(t, 3) for name, t in timings.items() if t > 0.5}
    assert not slow, timings

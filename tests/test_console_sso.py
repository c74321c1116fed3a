"""The console's single sign-on through OpenID Connect (console/sso.py) against a real provider: npm's
``oidc-provider`` (tests/clients/oidc.mjs), its login form posted as a browser would, its redirects
followed. An operator account signs in without a password of ours and sees what its role allows; a
name that is no account's is refused; a state that is not the browser's, a replayed callback and a
provider that has gone away are refused without a session (400, 400, 503 with Retry-After)."""

from __future__ import annotations

import http.client
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest

from billing.audit import Audit
from tests.conftest import Raw, Stack, free_port
from tests.test_console import HI, MODEL, Client, console_of, console_stack
from tests.test_operators import PASSWORDS, router

ROOT = Path(__file__).resolve().parent.parent
PROVIDER = ROOT / "tests" / "clients" / "oidc.mjs"
SECRET = "console-client-secret-at-the-provider"


@contextmanager
def provider(port: int, redirect: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        ["node", str(PROVIDER), str(port), SECRET, redirect],
        cwd=PROVIDER.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


class ProviderBrowser:
    """The browser's side at the provider: its cookies, its redirects, its login form."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cookies: dict[str, str] = {}

    def request(self, method: str, target: str, body: str | None = None) -> Raw:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = (
                {"cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}
            )
            if body is not None:
                headers["content-type"] = "application/x-www-form-urlencoded"
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            for name, value in resp.getheaders():
                if name.lower() == "set-cookie":
                    for morsel in SimpleCookie(value).values():
                        self.cookies[morsel.key] = morsel.value
            return Raw(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def sign_in(self, authorize: str, login: str) -> str:
        """From the console's redirect to the provider, through its login form, to the callback URL."""
        target = authorize
        for _ in range(10):
            parts = urlsplit(target)
            if parts.port != self.port:
                return target  # back to the console
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            answer = self.request("GET", path)
            if answer.status == 200:
                action = re.search(r'action="([^"]+)"', answer.text)
                assert action, answer.text[:300]
                answer = self.request(
                    "POST", action.group(1), urlencode({"login": login, "password": "right-password"})
                )
            assert answer.status in (302, 303), (
                answer.status,
                re.sub(r"<[^>]+>|\s+", " ", answer.text.split("<body>")[-1]),
            )
            location = answer.headers["location"]
            target = location if location.startswith("http") else f"http://127.0.0.1:{self.port}{location}"
        raise AssertionError("the provider never sent the browser back")


def local(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def sso_stack(tmp_path: Path, port: int) -> Stack:
    return console_stack(
        tmp_path, oidc_issuer=f"http://127.0.0.1:{port}", oidc_client_id="console", oidc_client_secret=SECRET
    )


def test_an_operator_signs_in_through_a_real_oidc_provider(tmp_path: Path) -> None:
    port = free_port()
    stack = sso_stack(tmp_path, port)
    try:
        mine, other = stack.group(100), stack.group(100)
        stack.client(stack.key(group=mine)).chat.completions.create(model=MODEL, messages=HI)
        router(
            stack, "add", "ops1", "--role", "operator", "--group", mine, "--stdin", password=PASSWORDS["ops1"]
        )
        with provider(port, f"http://127.0.0.1:{stack.port}/console/sso/callback"):
            console = Client(stack)
            login = console.get("/console/login")
            assert "Sign in with single sign-on" in login.text
            start = console.get("/console/sso?next=/console/groups")
            assert start.status == 303 and "mr_sso" in console.cookies
            authorize = start.headers["location"]
            assert (
                authorize.startswith(f"http://127.0.0.1:{port}/auth?")
                and "code_challenge_method=S256" in authorize
            )
            callback = ProviderBrowser(port).sign_in(authorize, "ops1")
            assert callback.startswith(f"http://127.0.0.1:{stack.port}/console/sso/callback?")
            done = console.get(local(callback))
            assert done.status == 200 and 'content="0; url=/console/groups"' in done.text, re.findall(
                r"alert\">([^<]*)", done.text
            )
            assert "mr_sso" not in console.cookies  # one use
            groups = console.get("/console/groups")
            assert groups.status == 200 and f">{mine}<" in groups.text and other not in groups.text
            assert (
                console.get(f"/console/groups/{other}").status == 404
            )  # its role, not the provider's, decides
            topup = console.post(f"/console/groups/{mine}/topup", {"amount": "5"})
            assert topup.status == 303
            log = stack.run(Audit(stack.store.database).entries(5))
            assert ("group.topup", "console:ops1 (127.0.0.1)") in {(e.action, e.actor) for e in log}
            replay = console.get(local(callback))  # the same callback again: its flow cookie is gone
            assert replay.status == 400 and "did not start in this browser" in replay.text

            # a name the provider vouches for but no operator account has: refused, no session
            stranger = Client(stack)
            start = stranger.get("/console/sso")
            refused = stranger.get(
                local(ProviderBrowser(port).sign_in(start.headers["location"], "stranger"))
            )
            assert refused.status == 403 and "no operator account is named" in refused.text
            assert stranger.get("/console/groups").status == 303  # to the login page

            # a callback whose state is not this browser's
            forged = Client(stack)
            forged.get("/console/sso")
            bad = forged.get("/console/sso/callback?" + urlencode({"code": "x", "state": "not-the-state"}))
            assert bad.status == 400 and forged.get("/console/groups").status == 303

            # the provider refuses the sign-in (the user cancelled at the provider, say)
            cancelled = Client(stack)
            start = cancelled.get("/console/sso")
            state = re.search(r"state=([^&]+)", start.headers["location"])
            assert state
            denied = cancelled.get(
                "/console/sso/callback?" + urlencode({"error": "access_denied", "state": state.group(1)})
            )
            assert denied.status == 401 and "access_denied" in denied.text

            # the provider goes away between the sign-in and the callback: 503, try again later
            late = Client(stack)
            start = late.get("/console/sso")
            pending = ProviderBrowser(port).sign_in(start.headers["location"], "ops1")
        gone = late.get(local(pending))
        assert (
            gone.status == 503 and gone.headers["retry-after"].isdigit() and "cannot be reached" in gone.text
        )
        assert late.get("/console/groups").status == 303
    finally:
        stack.stop()


def test_a_replayed_callback_and_a_claim_in_another_case_sign_nobody_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a provider that exchanges a code twice, the same callback sent again with its flow
    cookie signed in again: the state was checked against the cookie, never remembered. And the name
    claim was lower-cased, so the provider's "OPS1" (another person to it) signed in as ``ops1``. Now
    a state is taken once (a replay is 400, no session) and the claim must name an account as sent."""
    port = free_port()
    stack = sso_stack(tmp_path, port)
    try:
        router(stack, "add", "ops1", "--role", "viewer", "--stdin", password=PASSWORDS["ops1"])
        sso = console_of(stack).sso
        exchanged: dict[tuple[str, ...], str] = {}
        exchange = sso.username

        async def reusing(http: Any, settings: Any, flow: Any, code: str, redirect_uri: str) -> str:
            """A provider that answers a code it has exchanged before as it did the first time."""
            if (flow.state, code) not in exchanged:
                exchanged[flow.state, code] = await exchange(http, settings, flow, code, redirect_uri)
            return exchanged[flow.state, code]

        monkeypatch.setattr(sso, "username", reusing)
        with provider(port, f"http://127.0.0.1:{stack.port}/console/sso/callback"):
            console = Client(stack)
            start = console.get("/console/sso")
            flow_cookie = console.cookies["mr_sso"]
            callback = local(ProviderBrowser(port).sign_in(start.headers["location"], "ops1"))
            assert console.get(callback).status == 200 and console.get("/console/groups").status == 200
            replayer = Client(stack)  # the callback and its cookie, sent again
            replayer.cookies["mr_sso"] = flow_cookie
            replay = replayer.get(callback)
            assert replay.status == 400 and "used already" in replay.text, re.findall(
                r"alert\">([^<]*)", replay.text
            )
            assert replayer.get("/console/groups").status == 303  # no session

            other = Client(stack)
            start = other.get("/console/sso")
            refused = other.get(local(ProviderBrowser(port).sign_in(start.headers["location"], "OPS1")))
            assert refused.status == 403 and "no operator account is named &#39;OPS1&#39;" in refused.text
            assert other.get("/console/groups").status == 303
    finally:
        stack.stop()

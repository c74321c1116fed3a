"""Single sign-on through OpenID Connect (``[console] oidc_issuer``): the authorization code flow with
PKCE (RFC 7636) and a nonce; the ID token's signature checked against the issuer's published keys
(PyJWT), and its issuer, audience, expiry and nonce. The identity provider says who the person is; the
console's operator accounts say what they may do: the ID token's ``oidc_username_claim``
(``preferred_username``) names an account made with ``router operators add``, exactly as the provider
sends it (account names are lower-case; a claim that differs from one in case or spacing names no
account: two people the provider tells apart are never one operator), and a name that is no
account's (or the built-in ``admin``'s, which signs in with the admin password or token) is refused.

The routes (console/pages.py):

- ``GET /console/sso``: a state, a nonce and a PKCE verifier in a signed cookie (``mr_sso``, ten
  minutes, SameSite=Lax: it must come back with the provider's redirect, a cross-site navigation), then
  a redirect to the issuer's authorization endpoint.
- ``GET /console/sso/callback``: the state checked against the cookie (which is then dropped) and
  taken once (a state is remembered as used until its flow has expired, in the store or Redis as the
  login attempts are, gateway/attempts.py: a replayed callback is refused even by a provider that
  would exchange its code again), the code exchanged at the token endpoint (PKCE verifier, the client's secret by HTTP Basic), the ID
  token verified, and a session started as a password login starts one. The answer is a page that goes
  on to the console: the session cookie is SameSite=Strict, and a redirect straight out of the
  provider's navigation would arrive without it.

Faults: the issuer unreachable or answering an error: the login page, 503 with ``Retry-After`` (its
discovery document is kept an hour, its keys until a token names a key id they lack, then read once
more; the name is read from the UserInfo endpoint when the ID token does not carry it); a missing, expired, foreign or used state: 400; a refusal by the provider, a code it will not
exchange, an ID token that does not verify: 401; no account of that name: 403. Nothing is stored but
the session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import jwt

from core.config import ConsoleSettings

FLOW_COOKIE = "mr_sso"
FLOW_SECONDS = 600
DISCOVERY_SECONDS = 3600.0
# asymmetric signatures only: never "none", never a MAC keyed with the client's secret
ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
RETRY_AFTER = 30


class SSOError(Exception):
    """A sign-in that cannot go on; ``status`` is the login page's (503: try again later)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Issuer:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str = ""


@dataclass(frozen=True, slots=True)
class Flow:
    """What the browser carries from the start of a sign-in to its callback (signed, in ``mr_sso``)."""

    state: str
    nonce: str
    verifier: str
    next: str

    @staticmethod
    def new(next_: str) -> Flow:
        return Flow(secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(48), next_)

    def data(self) -> dict[str, object]:
        return {
            "s": self.state,
            "n": self.nonce,
            "v": self.verifier,
            "x": self.next,
            "e": int(time.time() + FLOW_SECONDS),
        }

    @staticmethod
    def of(data: dict[str, object] | None) -> Flow | None:
        try:
            if data is None or float(str(data["e"])) < time.time():
                return None
            return Flow(str(data["s"]), str(data["n"]), str(data["v"]), str(data.get("x") or ""))
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def challenge(self) -> str:
        digest = hashlib.sha256(self.verifier.encode()).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def enabled(settings: ConsoleSettings) -> bool:
    return bool(settings.oidc_issuer and settings.oidc_client_id)


def client_secret(settings: ConsoleSettings) -> str:
    return settings.oidc_client_secret or os.environ.get("ROUTER_OIDC_CLIENT_SECRET", "")


def client() -> aiohttp.ClientSession:
    """An HTTP client for one step of a sign-in (they are rare: no pool kept)."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))


class OIDC:
    """The issuer's discovery document and keys, kept between sign-ins."""

    def __init__(self) -> None:
        self._issuer: tuple[str, float, Issuer] | None = None
        self._keys: tuple[str, jwt.PyJWKSet] | None = None

    async def issuer(self, http: aiohttp.ClientSession, settings: ConsoleSettings) -> Issuer:
        url = settings.oidc_issuer.rstrip("/")
        kept = self._issuer
        if kept is not None and kept[0] == url and kept[1] > time.monotonic():
            return kept[2]
        doc = await _json(http, "GET", f"{url}/.well-known/openid-configuration")
        try:
            found = Issuer(
                str(doc["issuer"]),
                str(doc["authorization_endpoint"]),
                str(doc["token_endpoint"]),
                str(doc["jwks_uri"]),
                str(doc.get("userinfo_endpoint") or ""),
            )
        except (KeyError, TypeError):
            raise SSOError("the identity provider's discovery document lacks an endpoint", 503) from None
        if found.issuer.rstrip("/") != url:  # (OpenID Connect Discovery 1.0, section 4.3)
            raise SSOError(f"the identity provider says it is {found.issuer!r}, not {url!r}", 503)
        self._issuer = (url, time.monotonic() + DISCOVERY_SECONDS, found)
        return found

    def authorize_url(self, issuer: Issuer, settings: ConsoleSettings, flow: Flow, redirect_uri: str) -> str:
        query = {
            "response_type": "code",
            "client_id": settings.oidc_client_id,
            "redirect_uri": redirect_uri,
            "scope": "openid profile email",
            "state": flow.state,
            "nonce": flow.nonce,
            "code_challenge": flow.challenge,
            "code_challenge_method": "S256",
        }
        return f"{issuer.authorization_endpoint}?{urlencode(query)}"

    async def username(
        self, http: aiohttp.ClientSession, settings: ConsoleSettings, flow: Flow, code: str, redirect_uri: str
    ) -> str:
        """Exchange ``code`` and verify the ID token; the operator name its claim gives."""
        issuer = await self.issuer(http, settings)
        # client_secret_basic: each part form-encoded, then Basic (RFC 6749, section 2.3.1)
        basic = f"{quote(settings.oidc_client_id, safe='')}:{quote(client_secret(settings), safe='')}"
        auth = {"authorization": "Basic " + base64.b64encode(basic.encode()).decode()}
        tokens = await _json(
            http,
            "POST",
            issuer.token_endpoint,
            headers=auth,
            data={
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": redirect_uri,
                "code_verifier": flow.verifier,
            },
        )
        id_token = tokens.get("id_token")
        if not isinstance(id_token, str):
            raise SSOError("the identity provider gave no ID token")
        try:
            header = jwt.get_unverified_header(id_token)
            algorithm = header.get("alg")
            if algorithm not in ALGORITHMS:
                raise SSOError(
                    f"the ID token is signed with {algorithm!r}, which the console does not accept"
                )
            key = await self._key(http, issuer, header.get("kid"))
            claims = jwt.decode(
                id_token,
                key.key,
                algorithms=[algorithm],
                audience=settings.oidc_client_id,
                issuer=issuer.issuer,
                leeway=60,
                options={"require": ["exp", "iat", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise SSOError(f"the ID token does not verify ({exc})") from None
        if not hmac.compare_digest(str(claims.get("nonce", "")), flow.nonce):
            raise SSOError("the ID token is not this sign-in's (its nonce differs)")
        name = claims.get(settings.oidc_username_claim)
        access = tokens.get("access_token")
        if name is None and issuer.userinfo_endpoint and isinstance(access, str):
            # a provider may keep profile claims out of the ID token (OpenID Connect Core 1.0, 5.4): the
            # UserInfo endpoint has them, for the same subject (5.3.2)
            info = await _json(
                http, "GET", issuer.userinfo_endpoint, headers={"authorization": f"Bearer {access}"}
            )
            if info.get("sub") != claims["sub"]:
                raise SSOError("the identity provider's UserInfo is about another subject")
            name = info.get(settings.oidc_username_claim)
        if not isinstance(name, str) or not name:
            raise SSOError(f"the ID token has no {settings.oidc_username_claim!r} claim")
        return name  # as the provider sends it: "Alice" is not the account "alice", which may be another person's

    async def _key(self, http: aiohttp.ClientSession, issuer: Issuer, kid: Any) -> jwt.PyJWK:
        for fresh in (False, True):
            if fresh or self._keys is None or self._keys[0] != issuer.jwks_uri:
                try:
                    self._keys = (
                        issuer.jwks_uri,
                        jwt.PyJWKSet.from_dict(await _json(http, "GET", issuer.jwks_uri)),
                    )
                except jwt.PyJWTError as exc:
                    raise SSOError(f"the identity provider's keys cannot be read ({exc})", 503) from None
            keys = self._keys[1].keys
            found = [k for k in keys if kid is None or k.key_id == kid]
            if found:
                return found[0]
        raise SSOError("the ID token is signed with a key the identity provider does not publish")


async def _json(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> dict[str, Any]:
    try:
        async with http.request(method, url, **kw) as resp:
            body = await resp.json(content_type=None)
            if resp.status == 400 and isinstance(body, dict) and method == "POST":  # (RFC 6749, section 5.2)
                raise SSOError(
                    f"the identity provider refused the code ({body.get('error', 'invalid_request')})"
                )
            if resp.status != 200 or not isinstance(body, dict):
                raise SSOError(f"the identity provider answered {resp.status} at {url}", 503)
            return body
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        raise SSOError(f"the identity provider cannot be reached ({type(exc).__name__})", 503) from None

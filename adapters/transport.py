"""All upstream networking: one shared aiohttp ClientSession with pooled keep-alive connections.

``open`` sends a request and returns the response with its status read and its body not yet read;
network failures become gateway errors (connect failure → 503, timeout → 504, other → 502).
Only connecting has an aiohttp timeout: waiting for the answer's head is the caller's first-byte
deadline, and a read that stalls mid-answer the pipeline's (``read_timeout``: gateway/pipeline.py,
gateway/relay.py), both on the gateway's one timer (core/deadlines.py); aiohttp's ``sock_read``
re-arms a timer of the event loop on every read, about 8 % of the gateway's time relaying 10,000
streams.
The session keeps no cookies: a cookie a provider sets on one tenant's answer would otherwise go
back with every tenant's calls (tests/test_upstream_cookies.py).
"""

from __future__ import annotations

from typing import Any

import aiohttp

from adapters.base import UpstreamRequest
from core.deployments import Deployment
from core.errors import GatewayError, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from core.metrics import upstream_error


class Transport:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=True,
                cookie_jar=aiohttp.DummyCookieJar(),  # every tenant's calls share this session: keep no cookies
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _timeout(self, deployment: Deployment) -> aiohttp.ClientTimeout:
        key = deployment.connect_timeout
        timeout = self._timeouts.get(key)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=key)
            self._timeouts[key] = timeout
        return timeout

    async def open(self, request: UpstreamRequest, deployment: Deployment) -> aiohttp.ClientResponse:
        if self._session is None:
            await self.start()
        assert self._session is not None
        try:
            return await self._session.post(
                request.url, data=request.body, headers=request.headers, timeout=self._timeout(deployment)
            )
        except TimeoutError:
            raise UpstreamTimeout(f"The provider '{deployment.prefix}' did not answer in time.") from None
        except aiohttp.ClientConnectorError:
            raise UpstreamUnavailable(f"Could not connect to the provider '{deployment.prefix}'.") from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                f"The connection to the provider '{deployment.prefix}' failed: {type(exc).__name__}."
            ) from None


class ObservedTransport(Transport):
    """The shared transport, counting failed upstream attempts (every attempt, retries included)."""

    async def open(
        self, request: UpstreamRequest, deployment: Deployment, *args: Any, **kwargs: Any
    ) -> aiohttp.ClientResponse:
        try:
            response = await super().open(request, deployment, *args, **kwargs)
        except UpstreamTimeout:
            upstream_error(deployment.prefix, "timeout")
            raise
        except UpstreamUnavailable:
            upstream_error(deployment.prefix, "connect")
            raise
        except GatewayError:
            upstream_error(deployment.prefix, "network")
            raise
        if response.status >= 400:
            upstream_error(deployment.prefix, response.status)
        return response

"""``GET /readyz``: can this replica serve calls? (``GET /healthz`` only says the process is alive.)

Ready means the store answers a trivial query and the configured providers accept a TCP connection
(to the host and port of their base URL), each within ``[health] timeout``. The answer is cached for
``[health] cache_seconds``, and concurrent probes share one check, so a load balancer polling every
replica often costs the upstreams next to nothing. 200 with the details when ready, else 503.

``[health] upstreams`` says how many providers must be reachable: ``all`` (default), ``any`` or
``none`` (not checked). A provider counts as configured when the settings name it or it has a key;
each of its deployments is probed (``upstreams`` is keyed by deployment: the provider's prefix for the
single-account form, ``prefix/name`` otherwise). ``deployments`` reports, live, how long each one still
cools down (after a 429) and its calls in flight as this replica knows them; it does not change
readiness (a cooling deployment is a routing matter: the others serve).

``circuits`` reports each provider's circuit breaker (``closed``, ``open``, ``half-open``), live, and
does not change readiness: an open circuit means one provider keeps failing, and every replica sees
the same provider, so taking replicas out of the load balancer for it would only stop the calls to the
other providers too. Alert on ``router_circuit_state`` in /metrics instead.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from typing import Any
from urllib.parse import urlsplit

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from core import metrics
from gateway.state import Gateway
from router.replies import JSONBytes

_encode = msgspec.json.Encoder().encode


def address(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


async def reachable(host: str, port: int, seconds: float) -> str | None:
    """None if a TCP connection opens within ``seconds``, else why not."""
    try:
        async with asyncio.timeout(seconds):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return None


# /readyz: what serves (server/serve.py)
SERVER = f"hypercorn {importlib.metadata.version('hypercorn')}, {{}}"


class Readiness:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self._cached: tuple[float, bool, dict[str, Any]] | None = None
        self._running: asyncio.Future[tuple[bool, dict[str, Any]]] | None = None

    def targets(self) -> dict[str, tuple[str, int]]:
        settings = self.gw.settings
        return {
            dep.key: address(dep.base_url)
            for prefix, deps in sorted(self.gw.deployments.items())
            for dep in deps
            if prefix in settings.providers or dep.api_key
        }

    async def check(self) -> tuple[bool, dict[str, Any]]:
        cfg = self.gw.settings.health
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < cfg.cache_seconds:
            return self._cached[1], self._cached[2]
        if self._running is None:
            self._running = asyncio.ensure_future(self._check())
            self._running.add_done_callback(self._done)
        return await asyncio.shield(self._running)

    def _done(self, future: asyncio.Future[tuple[bool, dict[str, Any]]]) -> None:
        self._running = None
        if not future.cancelled() and future.exception() is None:
            ready, details = future.result()
            self._cached = (time.monotonic(), ready, details)

    async def _check(self) -> tuple[bool, dict[str, Any]]:
        cfg = self.gw.settings.health
        targets = self.targets() if cfg.upstreams != "none" else {}
        store, *results = await asyncio.gather(
            self._store(cfg.timeout),
            *(self._upstream(host, port, cfg.timeout) for host, port in targets.values()),
        )
        upstreams = dict(zip(targets, results, strict=True))
        up = sum(1 for r in results if r["ok"])
        if cfg.upstreams == "all":
            upstreams_ok = up == len(results)
        elif cfg.upstreams == "any":
            upstreams_ok = up > 0 or not results
        else:
            upstreams_ok = True
        ready = bool(store["ok"]) and upstreams_ok
        details: dict[str, Any] = {"status": "ready" if ready else "not_ready", "store": store}
        if cfg.upstreams != "none":
            details["upstreams"] = upstreams
        return ready, details

    async def _store(self, seconds: float) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(seconds):
                if not self.gw.started:
                    await self.gw.start()
                await self.gw.store.ping()
        except TimeoutError:
            return {"ok": False, "error": "timeout"}
        except Exception as exc:  # any failure of the store means not ready; say which
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
        return {"ok": True, "ms": round((time.perf_counter() - started) * 1000, 2)}

    @staticmethod
    async def _upstream(host: str, port: int, seconds: float) -> dict[str, Any]:
        started = time.perf_counter()
        error = await reachable(host, port, seconds)
        out: dict[str, Any] = {"ok": error is None, "address": f"{host}:{port}"}
        if error is None:
            out["ms"] = round((time.perf_counter() - started) * 1000, 2)
        else:
            out["error"] = error
        return out

    async def endpoint(self, request: Request) -> Response:
        ready, details = await self.check()
        # live, not cached
        details = {
            **details,
            "circuits": self.gw.breakers.states(),
            "open_circuits": self.gw.breakers.reasons(),
            "deployments": self.gw.dispatcher.report(),
            "server": SERVER.format("fast path" if self.gw.settings.server.fast_path else "stock"),
        }
        return JSONBytes(
            _encode(details), status_code=200 if ready else 503, headers={"cache-control": "no-store"}
        )


async def metrics_endpoint(request: Request) -> Response:
    """``GET /metrics``."""
    body, content_type = metrics.exposition(request.headers.get("accept"))
    return Response(body, media_type=content_type)

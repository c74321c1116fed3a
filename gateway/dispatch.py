"""Opening a call's upstream on one of its provider's deployments, moving on when one fails.

    Pool        one provider group: its deployments, which of them serve a model, the strategy
    open_on     order the deployments that serve the model (gateway/routing.py), put the call on the
                first that can take it (gateway/upstream_state.py), send; on a failure a fallback model
                might not have (gateway/reliability.py ``failover``) move to the next deployment at
                once, before any retry or fallback model; when every one has been tried, retry what is
                worth retrying with backoff, within the call's deadline

A deployment's own trouble stays its own: an upstream 429 cools it down for its Retry-After (or
``[routing] cooldown``), as does any failure that says when to come back (a Retry-After); other
failures count against its circuit breaker (``gw.breakers[deployment.key]``). When every deployment
is cooling down or at its RPM/TPM ceiling, the call waits for the first to come back if a retry is
left and the deadline allows, else it is a 429 with that Retry-After (and the pipeline's next
candidate model, if any, is tried).

A provider with one deployment and no ceilings, the default, costs next to nothing here: its order
is itself and its state this process's memory, with no Redis round trip.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

import aiohttp

from adapters.base import UpstreamRequest
from core import metrics
from core.catalog import Catalog, Model
from core.config import ProviderSettings, RoutingSettings, Settings
from core.deployments import Deployment, Strategy, canonical
from core.errors import GatewayError, RateLimited, UpstreamTimeout, UpstreamUnavailable
from gateway import routing
from gateway.reliability import REFUSED, backoff, breaker_failure, circuit_open, failover, retried, retryable
from gateway.upstream_state import Lease, MemoryState, UpstreamState

if TYPE_CHECKING:
    from gateway.state import Gateway


class Pool:
    """One provider group's deployments and how a call chooses among them."""

    def __init__(self, prefix: str, deployments: list[Deployment], own: ProviderSettings, catalog: Catalog) -> None:
        self.prefix = prefix
        self.deployments = tuple(deployments)
        self.strategy: Strategy = own.routing
        self.by_model: dict[str, Strategy] = {
            canonical(prefix, name, catalog, f"providers.{prefix}.model_routing"): s
            for name, s in own.model_routing.items()
        }
        self.sticky = own.sticky and len(deployments) > 1
        # worth the shared state (one Redis round trip a call): several deployments, or a ceiling
        self.shared = len(deployments) > 1 or any(d.rpm or d.tpm for d in deployments)
        self.tokens = any(d.tpm for d in deployments)  # a call's worst case in tokens must be counted
        self._serving: dict[str, tuple[Deployment, ...]] = {}

    def serving(self, model: Model) -> tuple[Deployment, ...]:
        found = self._serving.get(model.id)
        if found is None:
            found = self._serving[model.id] = tuple(d for d in self.deployments if d.serves(model))
        return found

    def strategy_for(self, model: Model) -> Strategy:
        return self.by_model.get(model.alias_of or model.id, self.strategy) if self.by_model else self.strategy


class Opened(NamedTuple):
    response: aiohttp.ClientResponse
    lease: Lease  # released when the call ends (its latency into the deployment's average)


class Router:
    """The pools of every provider group and the state they are routed on."""

    def __init__(self, pools: dict[str, Pool], settings: RoutingSettings, local: MemoryState,
                 shared: UpstreamState | None = None) -> None:  # fmt: skip
        self.pools = pools
        self.settings = settings
        self.local = local
        self.shared = shared or local
        self.rnd = random.Random()
        metrics.watch_deployments(self)

    def state(self, pool: Pool) -> UpstreamState:
        return self.shared if pool.shared else self.local

    def order(self, pool: Pool, model: Model, deps: tuple[Deployment, ...], state: UpstreamState,
              conversation: bytes | None) -> list[Deployment]:  # fmt: skip
        if len(deps) == 1:
            return [deps[0]]
        if pool.sticky and conversation is not None:
            ranked = routing.sticky(conversation, deps)
        else:
            loads = [state.load(d) for d in deps]
            ranked = routing.order(pool.strategy_for(model), deps, loads, self.rnd, self.settings.exploration)
        return [deps[i] for i in ranked]

    def resting(self) -> dict[tuple[str, str], float]:
        """Seconds each deployment still rests, as this replica knows (metrics)."""
        return {(d.prefix, d.name): self.state(pool).cooling(d) for pool in self.pools.values() for d in pool.deployments}

    def report(self) -> dict[str, dict[str, float | int]]:
        """Each deployment's rest left (seconds) and calls in flight, as this replica knows (/readyz)."""
        out: dict[str, dict[str, float | int]] = {}
        for pool in self.pools.values():
            state = self.state(pool)
            for dep in pool.deployments:
                out[dep.key] = {"cooling": round(state.cooling(dep), 3), "in_flight": state.load(dep).in_flight}
        return out

    def cooldown(self, error: GatewayError) -> float:
        """How long a deployment rests after ``error``: its Retry-After, else ``cooldown`` after a 429,
        else 0 (the breaker counts it)."""
        after = error.headers.get("Retry-After")
        if after:
            try:
                return min(max(float(after), 0.0), self.settings.max_cooldown)
            except ValueError:
                pass
        return self.settings.cooldown if isinstance(error, RateLimited) else 0.0

    async def close(self) -> None:
        if self.shared is not self.local:
            await self.shared.close()


def router_for(settings: Settings, catalog: Catalog, deployments: dict[str, list[Deployment]]) -> Router:
    """The router of a gateway: a pool per provider group, routed on Redis when ``[limits] redis_url``
    is set and some group has several deployments or a ceiling (else on this process's memory)."""
    pools = {
        prefix: Pool(prefix, deps, settings.providers.get(prefix, ProviderSettings()), catalog)
        for prefix, deps in deployments.items()
    }
    routing_settings = settings.routing
    local = MemoryState(routing_settings.latency_weight)
    shared: UpstreamState | None = None
    if settings.limits.redis_url and any(pool.shared for pool in pools.values()):
        from gateway.upstream_state_redis import RedisState

        shared = RedisState(settings.limits.redis_url, routing_settings.redis_prefix, settings.limits.redis_timeout,
                            routing_settings.latency_weight)  # fmt: skip
    return Router(pools, routing_settings, local, shared)


def all_busy(prefix: str, model_id: str, wait: float) -> RateLimited:
    if wait == math.inf:
        return RateLimited(f"The call is larger than the tokens-per-minute ceiling of every deployment of the "
                           f"provider '{prefix}' that serves `{model_id}`; send a shorter prompt or lower max_tokens.")  # fmt: skip
    seconds = max(math.ceil(wait), 1)
    return RateLimited(
        f"Every deployment of the provider '{prefix}' that serves `{model_id}` is cooling down or at its rate "
        f"ceiling; retry in {seconds} s.",
        headers={"Retry-After": str(seconds), "retry-after-ms": str(max(math.ceil(wait * 1000), 1))},
    )


async def open_on(gw: Gateway, model: Model, build: Callable[[Deployment], UpstreamRequest],
                  to_error: Callable[[int, bytes, Mapping[str, str]], GatewayError], deadline: float,
                  tokens: int = 0, conversation: bytes | None = None) -> Opened:  # fmt: skip
    """Send the call to a deployment of ``model``'s provider and return the response once its status
    is good, moving between deployments and retrying as the module says, within ``deadline``."""
    router = gw.router
    pool = router.pools[model.provider]
    deps = pool.serving(model)
    if not deps:
        raise UpstreamUnavailable(f"No deployment of the provider '{pool.prefix}' serves `{model.id}`.",
                                  code="no_deployment")  # fmt: skip
    state = router.state(pool)
    rel = gw.settings.reliability
    tried: set[str] = set()  # failed this call: the others first
    skipped: set[str] = set()  # their circuit's one probe is another call's
    attempt = 0
    waited = False  # the last step was a wait for a deployment to come back (that retry is spent)
    last: GatewayError | None = None
    while True:
        usable = tuple(d for d in deps if d.key not in skipped and gw.breakers[d.key].state != "open")
        if not usable:
            raise last or circuit_open(pool.prefix)
        order = router.order(pool, model, usable, state, conversation)
        if tried:  # deployments not tried yet come first, in the strategy's order
            order = [d for d in order if d.key not in tried] + [d for d in order if d.key in tried]
        got = await state.acquire(order, tokens) if pool.shared else router.local.acquire_now(order, tokens)
        if not isinstance(got, Lease):
            busy = all_busy(pool.prefix, model.id, got)
            if not waited and (attempt >= rel.max_retries or time.monotonic() + got > deadline):
                raise busy
            if got > deadline - time.monotonic():
                raise busy
            if not waited:
                attempt += 1
                retried(model.provider)
            waited = True
            await asyncio.sleep(got)
            continue
        waited = False
        dep = got.deployment
        breaker = gw.breakers[dep.key]
        ticket = breaker.allow()
        if ticket == REFUSED:  # half-open, and its one probe is another call's
            got.owner.release(got)
            skipped.add(dep.key)
            continue
        try:
            response = await _send(gw, build(dep), dep, to_error)
        except GatewayError as exc:
            error = exc
        else:
            breaker.success()
            got.latency = time.monotonic() - got.opened_at
            metrics.deployment_call(dep.prefix, dep.name, "ok", got.latency)
            return Opened(response, got)
        finally:  # a probe that ended without a verdict (a 429, a 4xx, the caller gone): the next probes
            if ticket:
                breaker.release(ticket)
        rest = router.cooldown(error)
        got.owner.release(got, cooldown=rest)
        metrics.deployment_call(dep.prefix, dep.name, "rate_limited" if isinstance(error, RateLimited) else "error")
        if rest:
            metrics.deployment_cooldown(dep.prefix, dep.name)
        if breaker_failure(error):
            breaker.failure()
        if not failover(error):
            raise error
        last = error
        tried.add(dep.key)
        if any(d.key not in tried and d.key not in skipped for d in deps):
            continue  # another deployment may serve at once: no backoff, no retry spent
        wait = backoff(attempt, rel.backoff_base, rel.backoff_max, error.headers.get("Retry-After"))
        if not retryable(error) or attempt >= rel.max_retries or time.monotonic() + wait > deadline:
            raise error
        attempt += 1
        retried(model.provider)
        waited = True
        await asyncio.sleep(wait)


async def _send(gw: Gateway, upstream: UpstreamRequest, dep: Deployment,
                to_error: Callable[[int, bytes, Mapping[str, str]], GatewayError]) -> aiohttp.ClientResponse:  # fmt: skip
    """One attempt: the response once its headers say it succeeded, else the error it means."""
    first_byte = gw.settings.reliability.first_byte_timeout
    try:
        with gw.deadlines.after(first_byte):
            response = await gw.transport.open(upstream, dep)
            if response.status >= 400:
                try:
                    body = await response.read()
                finally:
                    response.release()
                raise to_error(response.status, body, response.headers)
            return response
    except TimeoutError:
        metrics.upstream_error(dep.prefix, "timeout")
        raise UpstreamTimeout(f"The provider '{dep.prefix}' sent no answer within {first_byte:g} s.") from None

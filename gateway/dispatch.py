"""Which deployment serves a call: a pool per provider group, the state it is routed on, the order.

    Pool        one provider group: its deployments, which of them serve a model, its strategy and
                whether it routes conversations (sticky)
    Dispatcher  the pools of a gateway and the state they are routed on (gateway/upstream_state.py:
                this process's memory, or Redis when ``[limits] redis_url`` is set and some group has
                several deployments or a ceiling); ``order`` is a call's order of the deployments
                (gateway/routing.py), ``cooldown`` how long one rests after a failure

The loop that puts a call on a deployment and moves it to the next one when it fails is
``gateway.reliability.open_upstream``, beside the retry decisions.

A provider with one deployment and no ceilings, the default, costs next to nothing: its order is
itself and its state this process's memory, with no Redis round trip.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from core import metrics
from core.catalog import Catalog, Model
from core.config import ProviderSettings, RoutingSettings, Settings
from core.deployments import Deployment, Strategy, canonical
from core.errors import GatewayError, RateLimited
from gateway import backends, routing
from gateway.upstream_state import MemoryState, UpstreamState

if TYPE_CHECKING:
    pass


class Pool:
    """One provider group's deployments and how a call chooses among them."""

    def __init__(
        self, prefix: str, deployments: list[Deployment], own: ProviderSettings, catalog: Catalog
    ) -> None:
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
        self._serving: dict[tuple[str, str], tuple[Deployment, ...]] = {}
        # (deployment key, model) -> until when: a deployment that answered 404 for the model (it does not
        # have it, or not the endpoint) is left out of its calls meanwhile (gateway/reliability.py)
        self._unserved: dict[tuple[str, str], float] = {}

    def serving(self, model: Model, endpoint: str = "chat") -> tuple[Deployment, ...]:
        """The deployments that serve ``model`` on ``endpoint`` (as configured, less those that answered
        404 for it lately, unless that leaves none)."""
        found = self._serving.get((model.id, endpoint))
        if found is None:
            found = self._serving[model.id, endpoint] = tuple(
                d for d in self.deployments if d.serves(model, endpoint)
            )
        if self._unserved:
            now = time.monotonic()
            known = model.alias_of or model.id
            usable = tuple(d for d in found if self._unserved.get((d.key, known), 0.0) <= now)
            return usable or found
        return found

    def unserved(self, deployment: Deployment, model: Model, seconds: float) -> None:
        """``deployment`` answered 404 for ``model``: other deployments serve it for ``seconds``."""
        now = time.monotonic()
        self._unserved = {
            k: until for k, until in self._unserved.items() if until > now
        }  # (few: a misconfiguration's)
        self._unserved[deployment.key, model.alias_of or model.id] = now + seconds

    def strategy_for(self, model: Model) -> Strategy:
        return (
            self.by_model.get(model.alias_of or model.id, self.strategy) if self.by_model else self.strategy
        )


class Dispatcher:
    """The pools of every provider group and the state they are routed on."""

    def __init__(
        self,
        pools: dict[str, Pool],
        settings: RoutingSettings,
        local: MemoryState,
        shared: UpstreamState | None = None,
    ) -> None:
        self.pools = pools
        self.settings = settings
        self.local = local
        self.shared = shared or local
        self.rnd = random.Random()  # noqa: S311 (spreads calls over deployments: not a secret)
        metrics.watch_deployments(self)

    def state(self, pool: Pool) -> UpstreamState:
        return self.shared if pool.shared else self.local

    def order(
        self, pool: Pool, model: Model, deps: tuple[Deployment, ...], state: UpstreamState, ask: routing.Ask
    ) -> list[Deployment]:
        if len(deps) == 1:
            return [deps[0]]
        if pool.sticky and ask.conversation is not None:
            ranked = routing.sticky(ask.conversation, deps)
        else:
            key = model.alias_of or model.id
            loads = [state.load(d, key) for d in deps]
            ranked = routing.order(
                pool.strategy_for(model), deps, loads, self.rnd, self.settings.exploration, ask.stream
            )
        return [deps[i] for i in ranked]

    def resting(self) -> dict[tuple[str, str], float]:
        """Seconds each deployment still rests (for any model), as this replica knows (metrics)."""
        return {
            (d.prefix, d.name): max(self.state(pool).resting(d).values(), default=0.0)
            for pool in self.pools.values()
            for d in pool.deployments
        }

    def report(self) -> dict[str, dict[str, Any]]:
        """Each deployment's calls in flight and the models it rests for, with the seconds left, as
        this replica knows (/readyz)."""
        out: dict[str, dict[str, Any]] = {}
        for pool in self.pools.values():
            state = self.state(pool)
            for dep in pool.deployments:
                resting = {m: round(s, 3) for m, s in sorted(state.resting(dep).items())}
                out[dep.key] = {"in_flight": state.load(dep, "").in_flight, "resting": resting}
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


def dispatcher_for(
    settings: Settings, catalog: Catalog, deployments: dict[str, list[Deployment]]
) -> Dispatcher:
    """The dispatcher of a gateway: a pool per provider group, routed on Redis when ``[limits] redis_url``
    is set and some group has several deployments or a ceiling (else on this process's memory)."""
    pools = {
        prefix: Pool(prefix, deps, settings.providers.get(prefix, ProviderSettings()), catalog)
        for prefix, deps in deployments.items()
    }
    routing_settings = settings.routing
    local = MemoryState(routing_settings.latency_weight)
    shared = backends.upstream_state(
        settings.limits, routing_settings, any(pool.shared for pool in pools.values())
    )
    return Dispatcher(pools, routing_settings, local, shared)

"""Where the gateway's shared counts live: this process's memory, or Redis shared by the replicas
(``[limits] redis_url``). The one place that picks an implementation; the interfaces it picks for
(gateway/ratelimit.py, gateway/concurrency.py, gateway/upstream_state.py) import none of them, and
their users (gateway/state.py) are handed what is built here.

    rate_limits(settings)                  gateway.ratelimit_memory | gateway.ratelimit_redis
    in_flight(settings, rate_limits)       gateway.concurrency (memory) | gateway.concurrency_redis,
                                           sharing the rate limits' script pipe when they have one
    upstream_state(settings, routing)      None (each process routes on its own memory) |
                                           gateway.upstream_state_redis
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway import concurrency, ratelimit
from gateway.upstream_state import UpstreamState

if TYPE_CHECKING:
    from core.config import LimitsSettings, RoutingSettings


def rate_limits(settings: LimitsSettings) -> ratelimit.Backend | None:
    """The rate limits' backend; None when no rate limit is set."""
    if not ratelimit.configured(settings):
        return None
    if settings.redis_url:
        from gateway.ratelimit_redis import RedisBackend

        return RedisBackend(settings.redis_url, settings.redis_prefix, settings.redis_timeout)
    from gateway.ratelimit_memory import MemoryBackend

    return MemoryBackend()


def in_flight(settings: LimitsSettings, limits: ratelimit.Backend | None) -> concurrency.Backend | None:
    """The counts of calls in flight; None when no such limit is set. With Redis, on the rate limits'
    connection and script pipe when they use Redis too (one round trip for both checks)."""
    if not concurrency.configured(settings):
        return None
    if settings.redis_url:
        from gateway.concurrency_redis import RedisBackend

        pipe = limits.pipe if limits is not None else None
        return RedisBackend(settings.redis_url, settings.redis_prefix, settings.redis_timeout, pipe=pipe)
    return concurrency.MemoryBackend()


def upstream_state(limits: LimitsSettings, routing: RoutingSettings, shared: bool) -> UpstreamState | None:
    """The deployments' state shared by the replicas, when Redis is configured and some provider group
    has something to share (``shared``: several deployments, or a ceiling); else None."""
    if not (limits.redis_url and shared):
        return None
    from gateway.upstream_state_redis import RedisState

    return RedisState(limits.redis_url, routing.redis_prefix, limits.redis_timeout, routing.latency_weight)

"""The credit ledger on top of a store: reserve the worst case before a call, settle the real cost
after it, exactly once, whatever happened in between (design §6).

    reserve ──► upstream call ──► settle(real cost)      (the rest of the reservation goes back)
       │ 402 if the group cannot afford the worst case; nothing is sent upstream
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from billing import tokens
from billing.pricing import cost
from billing.store import Refusal, Reservation, Store, UsageRecord
from router import metrics
from router.catalog import NANO, Model
from router.errors import InsufficientCredits
from router.wire import TokenUsage


def credits(nano: int) -> str:
    whole, frac = divmod(nano, NANO)
    return f"{whole}.{frac:09d}".rstrip("0").rstrip(".")


class Ledger:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def reserve(self, group_id: int, key_id: int, amount: int) -> Reservation:
        result = await self.store.reserve(group_id, key_id, amount)
        if isinstance(result, Refusal):
            if result.reason == "key_cap":
                raise InsufficientCredits(
                    f"This API key's spend cap does not cover this call: it needs up to {credits(result.needed)} "
                    f"credits and the key has {credits(result.available)} left under its cap. Lower max_tokens or "
                    "raise the key's cap.",
                    code="key_spend_cap_reached",
                )
            raise InsufficientCredits(
                f"Insufficient credits: this call needs up to {credits(result.needed)} credits (its worst case, "
                f"from max_tokens and the prompt) and the group's balance is {credits(result.available)}. "
                "Top up the group or lower max_tokens."
            )
        return result


@dataclass(slots=True)
class Meter:
    """Settles one call exactly once: its usage record and its charge."""

    ledger: Ledger
    reservation: Reservation
    model: Model
    record: UsageRecord
    messages: Any  # the request's messages, to estimate a prompt whose usage the upstream never gave
    started: float = field(default_factory=time.monotonic)
    settled: bool = False

    async def finish(self, usage: TokenUsage | None, status: str, *, generated: str = "", error: str | None = None,
                     first_token_at: float | None = None, upstream_id: str | None = None) -> None:  # fmt: skip
        if self.settled:
            return
        self.settled = True
        record = self.record
        exact = usage is not None
        if usage is None and (generated or status == "interrupted"):
            usage = await asyncio.get_running_loop().run_in_executor(None, self._estimate, generated)
        if usage is None:
            usage = TokenUsage()  # failed before the provider produced anything: costs nothing
        record.prompt_tokens = usage.prompt
        record.completion_tokens = usage.completion
        record.cached_tokens = usage.cached
        record.cache_write_tokens = usage.cache_write
        record.reasoning_tokens = usage.reasoning
        record.credits = cost(self.model.prices, usage)
        record.status = status
        record.usage_exact = exact
        record.error = error
        record.upstream_request_id = upstream_id
        now = time.monotonic()
        record.latency_ms = (now - self.started) * 1000
        record.ttft_ms = (first_token_at - self.started) * 1000 if first_token_at else None
        record.ts = time.time()
        metrics.call_settled(record)
        await asyncio.shield(self.ledger.store.settle(self.reservation, record))

    def _estimate(self, generated: str) -> TokenUsage:
        messages = self.messages if isinstance(self.messages, list) else []
        return TokenUsage(prompt=tokens.count_messages(messages), completion=tokens.count(generated))

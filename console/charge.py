"""How a call's charge came to be, for the call's page: its token counts at the model's prices, the
formula (``billing.pricing.cost``: each kind of token at its price per million, the sum rounded up
once to a whole nano-credit) and what the record says beyond it (refused before its reservation,
cut off, counts estimated). The prices are the catalog's now: a call made before a price change, or
with what the record does not keep (input images, hour-long cache writes, generated images), is
said to differ rather than explained wrongly."""

from __future__ import annotations

from dataclasses import dataclass

from billing.pricing import cost
from billing.store import UsageRecord
from core.catalog import Catalog
from core.wire import TokenUsage


@dataclass(frozen=True, slots=True)
class Line:
    kind: str
    tokens: int
    price: int  # nano-credits per 1M tokens
    amount: int  # tokens x price, in nano-credits per 1M (the sum is divided once)


@dataclass(frozen=True, slots=True)
class Charge:
    lines: list[Line]
    computed: int  # nano-credits: the formula's total
    charged: int  # what the record holds
    notes: list[str]

    @property
    def matches(self) -> bool:
        return self.computed == self.charged


def explain(catalog: Catalog, r: UsageRecord) -> Charge | None:
    """The charge of ``r`` at the catalog's prices; None when the model is not (or no longer) priced."""
    model = catalog.models.get(r.model)
    if model is None:
        return None
    p = model.prices
    cached = min(r.cached_tokens, r.prompt_tokens)
    written = min(r.cache_write_tokens, r.prompt_tokens - cached)
    fresh = r.prompt_tokens - cached - written
    lines = [
        Line("Input", fresh, p.input, fresh * p.input),
        Line("Cached input", cached, p.cached_input, cached * p.cached_input),
        Line("Cache writes", written, p.cache_write, written * p.cache_write),
        Line("Output (reasoning included)", r.completion_tokens, p.output, r.completion_tokens * p.output),
    ]
    usage = TokenUsage(
        prompt=r.prompt_tokens,
        completion=r.completion_tokens,
        cached=r.cached_tokens,
        cache_write=r.cache_write_tokens,
        reasoning=r.reasoning_tokens,
    )
    computed = cost(p, usage) if r.status != "rejected" else 0
    notes = []
    if r.status == "rejected":
        notes.append("Refused before its reservation: nothing was charged.")
    elif r.status == "interrupted":
        notes.append("Cut off before its end: charged for what was generated until then.")
    elif r.status == "error" and not r.credits:
        notes.append("Failed upstream before any output: nothing was charged.")
    if not r.usage_exact:
        notes.append("The provider did not report usage: the token counts are the gateway's estimate.")
    if r.status != "rejected" and computed != r.credits:
        notes.append(
            "The charge differs from these prices: the catalog's prices changed since the call, or it had "
            "input images, hour-long cache writes or generated images, which are priced apart."
        )
    return Charge([line for line in lines if line.tokens], computed, r.credits, notes)

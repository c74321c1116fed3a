"""Prices in exact integer arithmetic: nano-credits (1 credit = 10^9 nano-credits) per 1M tokens.

``cost`` sums every kind of token at its price and rounds up once, at the end, to a whole
nano-credit: no floats anywhere. Reasoning tokens are part of ``completion`` and billed as output.
Cached input is billed at the cached price, cache writes at the cache-write price (those kept for an
hour at theirs), the rest of the prompt at the input price.
"""

from __future__ import annotations

from core.catalog import Model, Prices
from core.wire import ChatRequest, ImagePart, TokenUsage

PER = 1_000_000
IMAGE_TOKENS = 1_600  # reserve per image part (providers count 85..~1,600 tokens per image)
FALLBACK_OUTPUT = 4_096


def cost(prices: Prices, usage: TokenUsage) -> int:
    cached = min(usage.cached, usage.prompt)
    written = min(usage.cache_write, usage.prompt - cached)
    hour = min(usage.cache_write_1h, written)
    pictured = min(usage.image_prompt, usage.prompt - cached - written)
    fresh = usage.prompt - cached - written - pictured
    total = (
        fresh * prices.input
        + cached * prices.cached_input
        + (written - hour) * prices.cache_write
        + hour * prices.cache_write_1h
        + pictured * prices.image_input
        + usage.completion * prices.output
        + usage.images * prices.image * PER
    )
    return -(-total // PER)  # ceil


def output_ceiling(model: Model, request: ChatRequest) -> int:
    """The most output tokens this call can produce (and so must be reserved for)."""
    cap = request.output_cap
    if cap is None:
        cap = model.default_max_tokens or model.max_output or FALLBACK_OUTPUT
    if model.max_output:
        cap = min(cap, model.max_output)
    return cap * (request.n or 1)


def input_ceiling(body_size: int, request: ChatRequest) -> int:
    """An upper bound of the prompt's tokens: a token covers at least one byte of text, so the body's
    size bounds the text; each image adds a fixed allowance instead of its (base64) bytes."""
    images = 0
    image_bytes = 0
    for message in request.messages:
        if isinstance(message.content, list):
            for part in message.content:
                if isinstance(part, ImagePart):
                    images += 1
                    url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
                    image_bytes += len(url)
    return max(body_size - image_bytes, 0) + images * IMAGE_TOKENS


def worst_case(model: Model, body_size: int, request: ChatRequest, max_output: int | None = None) -> int:
    """Nano-credits to reserve before the call: the most it can cost. ``max_output``: the output cap
    the upstream request carries, when its adapter set one other than the caller's (Anthropic's
    ``max_tokens`` raised for ``reasoning_effort``); else :func:`output_ceiling`."""
    completion = output_ceiling(model, request) if max_output is None else max_output * (request.n or 1)
    usage = TokenUsage(prompt=input_ceiling(body_size, request), completion=completion)
    prices = model.prices
    worst_input = max(prices.input, prices.cache_write, prices.cache_write_1h, prices.image_input)
    images = (request.n or 1) * prices.image * PER if prices.image else 0  # per-image models (Imagen)
    return -(-(usage.prompt * worst_input + usage.completion * prices.output + images) // PER)

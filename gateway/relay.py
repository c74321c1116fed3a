"""Relaying one upstream stream to the caller, for every endpoint: the stream half of the call
lifecycle (gateway/pipeline.py). What the pieces are is the codec's :class:`~gateway.codec.Reader`'s
business; how the stream ends, and that the call is settled exactly once, is this loop's.

A batch of pieces goes out per upstream network read. The last batch (a :class:`LastBatch`: nothing
follows it) holds what the last read brought and the reader's end — after a proper end its ``end()``,
after a failure its ``fail(exc)``: an upstream error in-band, a stream that stopped before its end, a
lost connection or one silent for the deployment's ``read_timeout`` (what arrived before is still
relayed, and billed). The call is settled, and its settlement durable,
before the last batch goes out — before the reader's end is made, so that its usage can carry the
charge (``usage.cost``) — or in ``finally`` when the consumer went away (``interrupted``: nothing
more goes out, the usage record alone says what it cost).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import aiohttp

from adapters.base import upstream_request_id
from billing.ledger import Meter
from core.deadlines import Idle
from core.errors import GatewayError, UpstreamError
from core.types import CallStatus
from gateway.codec import Reader, cost_of


@dataclass(slots=True)
class StreamEnd:
    """How a stream ended, for its usage record."""

    status: CallStatus = "ok"
    first_token_at: float | None = None
    error: str | None = None


class LastBatch(list):
    """The last batch of :func:`relay` (nothing follows it)."""


async def relay(
    reader: Reader,
    response: aiohttp.ClientResponse,
    meter: Meter,
    provider: str,
    idle: Idle,
    show_cost: bool = False,
) -> AsyncGenerator[list[Any], None]:
    """The caller's pieces, a batch per upstream read, ending with a :class:`LastBatch`. ``idle``: the
    deadline of each read, renewed at each (the deployment's ``read_timeout``: an upstream silent that
    long has failed).
    ``show_cost``: the reader's end carries the call's charge (:class:`~gateway.codec.Cost`; it is
    settled first)."""
    outcome = StreamEnd()
    meter.follow(reader)  # its usage so far kept every few seconds (billing/progress.py)
    out = reader.start()
    content = response.content
    try:
        try:
            with idle:
                while True:
                    idle.renew()
                    data = await content.readany()
                    idle.pause()  # (not counting while the caller's side writes what came)
                    if not data:  # the upstream's end
                        reader.close(out)
                        break
                    reader.feed(data, out)
                    if out and outcome.first_token_at is None:
                        outcome.first_token_at = time.monotonic()
                    if reader.finished:
                        break  # what this read brought goes out with the end of the stream, in one piece
                    if out:
                        yield out
                        out = []
            if not reader.complete:
                raise UpstreamError(
                    f"The provider '{provider}' ended the stream before the answer was complete."
                )
            failure: GatewayError | None = None
        except GatewayError as exc:
            outcome.status, outcome.error = "error", exc.message
            meter.record.error_code = exc.code or exc.type
            failure = exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            try:  # what the upstream sent before it failed is still the caller's (and billed)
                reader.feed(_unread(response), out)
            except GatewayError:
                pass
            outcome.status = "error"
            outcome.error = f"connection to provider lost: {type(exc).__name__}"
            meter.record.error_code = UpstreamError.code
            failure = UpstreamError(f"The connection to the provider '{provider}' was lost mid-stream.")
        if reader.error is not None and outcome.status == "ok":  # reported in-band, in a proper end
            outcome.status, outcome.error = "error", reader.error
        await _settle(meter, reader, outcome, response, reply=True)
        await meter.durable()  # the end of the stream goes out once its charge is stored
        if show_cost:  # the charge just computed, in the stream's usage (the record holds the same)
            reader.cost = cost_of(meter.record)
        out += reader.end() if failure is None else reader.fail(failure)
        yield LastBatch(out)
    except (GeneratorExit, asyncio.CancelledError):
        outcome.status = "interrupted"
        raise
    finally:
        if not reader.finished or outcome.status != "ok":
            response.close()  # drop the connection: the rest of the upstream stream is not read
        else:
            response.release()
        await _settle(meter, reader, outcome, response)


def _unread(response: aiohttp.ClientResponse) -> bytes:
    """Bytes aiohttp received but will not hand out once the connection failed (its ``readany``
    raises the failure before looking at its buffer)."""
    buffer = getattr(response.content, "_buffer", None)
    if not buffer:
        return b""
    data = b"".join(buffer)
    buffer.clear()
    return data


async def _settle(
    meter: Meter, reader: Reader, outcome: StreamEnd, response: aiohttp.ClientResponse, reply: bool = False
) -> None:
    if meter.finished:
        return
    usage, prompt_usage = reader.reported()
    await meter.finish(
        usage,
        outcome.status,
        generated=reader.generated(),
        error=outcome.error,
        first_token_at=outcome.first_token_at,
        upstream_id=upstream_request_id(response.headers),
        prompt_usage=prompt_usage,
        reply=reply,
    )

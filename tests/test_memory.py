"""What the gateway keeps between bursts stays bounded (issue 56, item 9: RSS grew per 1,000-stream burst)."""

from __future__ import annotations

import asyncio

from billing.sqlite import _ROWS_PER_INSERT, _insert_sql
from tests.conftest import Stack


def test_bursts_of_any_size_compile_a_bounded_set_of_usage_inserts(stack: Stack) -> None:
    """Each burst's settlements are written as one batch; the usage rows go in by statements of a power
    of two rows, so sqlite3's statement cache (each compiled statement about 2 KiB a row) holds at most
    nine sizes per form of the statement however many batch sizes the bursts make, and burst after
    burst it stops growing."""
    client = stack.async_client()

    async def burst(n: int) -> None:
        async def one() -> None:
            stream = await client.chat.completions.create(
                model="openai/gpt-4o-mini",
                messages=[{"role": "user", "content": "burst [tokens:3]"}],
                stream=True,
            )
            async for _ in stream:
                pass

        await asyncio.gather(*(one() for _ in range(n)))

    sizes = [3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 19, 21, 22, 23, 25, 26, 27, 29, 31, 37, 41, 43, 47, 53]
    try:
        for n in sizes:
            stack.run(burst(n))
        stack.run(asyncio.sleep(0))  # every settlement written
        after_first = _insert_sql.cache_info().currsize
        for n in sizes:
            stack.run(burst(n))
        stack.run(asyncio.sleep(0))
    finally:
        stack.run(client.close())
    forms, sizes_per_form = 2, _ROWS_PER_INSERT.bit_length()
    assert _insert_sql.cache_info().currsize <= forms * sizes_per_form
    assert _insert_sql.cache_info().currsize == after_first

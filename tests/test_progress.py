"""billing/progress.py: a checkpoint writes the streams that generated something since the last one,
each ``every`` seconds apart, and a write the store failed is made again at the next tick (on both
stores)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from bench.checkpoints import MODEL, Source  # (a stream whose text the test grows)
from billing import tokens
from billing.backends import open_store
from billing.ledger import Meter, ledger_for
from billing.store import Hold, StoreDown, UsageRecord
from core.config import StoreSettings

SO_FAR, MORE, THEN = "the answer so far", " and more of it", ", then this"
EVERY = 0.2


async def test_a_checkpoint_writes_what_changed_and_a_failed_write_is_made_again(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens.encoding()  # loaded before, as the gateway does at its start (a tick must take less than EVERY)
    store = open_store(store_url)
    await store.open()
    await store.serve(StoreSettings(url=store_url))
    ledger = ledger_for(store, checkpoint=EVERY)
    await ledger.start(None)
    try:
        group = await store.create_group("g", 10**15)
        key = await store.create_key("g", "k", os.urandom(32).hex(), "hint")
        sources = []
        for n in range(2):
            reservation = await ledger.reserve(group.id, key.id, 10**9, Hold(MODEL.id, "openai", f"r{n}"))
            record = UsageRecord(key_id=key.id, group_id=group.id, model=MODEL.id, provider="openai", stream=True,
                                 request_id=f"r{n}", deployment="d", metadata='{"a":"b"}')  # fmt: skip
            meter = Meter(ledger, reservation, MODEL, record, {"messages": [{"role": "user", "content": "hi"}]})
            meter.started -= 2.0  # old enough to be due
            meter.follow(source := Source())
            sources.append(source)
        written: list[list[tuple[Any, UsageRecord]]] = []
        real = store.note_progress

        def spy(progress: list[tuple[Any, UsageRecord]]) -> Any:
            written.append(progress)
            return real(progress)

        monkeypatch.setattr(store, "note_progress", spy)
        sources[0].text = sources[1].text = SO_FAR
        assert await ledger.progress.tick() == 2
        sources[1].text += MORE
        assert await ledger.progress.tick() == 0  # each is due ``every`` seconds after its last
        await asyncio.sleep(EVERY)
        assert await ledger.progress.tick() == 1  # the other had nothing new: nothing written
        (_, second), = written[-1]
        # (counted on what each checkpoint added)
        assert second.request_id == "r1" and second.completion_tokens == tokens.count(SO_FAR) + tokens.count(MORE)
        assert second.status == "interrupted" and not second.usage_exact and second.credits > 0
        assert (second.deployment, second.metadata, second.stream) == ("d", '{"a":"b"}', True)  # the rest copied

        def down(progress: list[tuple[Any, UsageRecord]]) -> Any:
            raise StoreDown("the store is down")

        sources[0].text += THEN
        await asyncio.sleep(EVERY)
        monkeypatch.setattr(store, "note_progress", down)
        with pytest.raises(StoreDown):
            await ledger.progress.tick()
        monkeypatch.setattr(store, "note_progress", spy)
        assert await ledger.progress.tick() == 1  # what the failed write held, at the next tick
        (_, first), = written[-1]
        assert first.request_id == "r0" and first.completion_tokens == tokens.count(SO_FAR) + tokens.count(THEN)
    finally:
        await ledger.close()
        await store.close()

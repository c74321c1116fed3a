"""billing/progress.py: a checkpoint writes the streams that generated something since the last one,
each ``every`` seconds apart, as the text each added; a write the store failed is made again at the next
tick, and one that seemed to fail but landed is not kept twice; a stream cut after its checkpoints is
charged the tokens of all the text they kept (on both stores, through each store's own recovery)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from bench.checkpoints import MODEL, Source  # (a stream whose text the test grows)
from billing import tokens
from billing.backends import open_store
from billing.ledger import Meter, ledger_for
from billing.pricing import cost
from billing.progress import charged
from billing.store import Checkpoint, Hold, Reservation, Store, StoreDown, UsageRecord
from core.config import StoreSettings
from core.wire import TokenUsage

SO_FAR, MORE, THEN, LAST = "the answer so far", " and more of it", ", then this \x00 é", " and the end"
EVERY = 0.2


async def _opened(url: str) -> Store:
    store = open_store(url)
    await store.open()
    await store.serve(StoreSettings(url=url))
    return store


async def test_checkpoints_keep_the_text_added_and_a_cut_stream_is_charged_its_tokens(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens.encoding()  # loaded before, as the gateway does at its start (a tick must take less than EVERY)
    store = await _opened(store_url)
    ledger = ledger_for(store, checkpoint=EVERY)
    await ledger.start(None)
    reservations: list[Reservation] = []
    try:
        group = await store.create_group("g", 10**15)
        key = await store.create_key("g", "k", os.urandom(32).hex(), "hint")
        sources = []
        for n in range(2):
            reservation = await ledger.reserve(group.id, key.id, 10**9, Hold(MODEL.id, "openai", f"r{n}"))
            assert isinstance(reservation, Reservation)
            reservations.append(reservation)
            record = UsageRecord(key_id=key.id, group_id=group.id, model=MODEL.id, provider="openai", stream=True,
                                 request_id=f"r{n}", deployment="d", metadata='{"a":"b"}')  # fmt: skip
            meter = Meter(ledger, reservation, MODEL, record, {"messages": [{"role": "user", "content": "hi"}]})
            meter.started -= 2.0  # old enough to be due
            meter.follow(source := Source())
            sources.append(source)
        written: list[list[Checkpoint]] = []
        real = store.note_progress

        def spy(progress: list[Checkpoint]) -> Any:
            written.append(progress)
            return real(progress)

        monkeypatch.setattr(store, "note_progress", spy)
        sources[0].text = sources[1].text = SO_FAR
        assert await ledger.progress.tick() == 2
        assert [(c.text, c.start, c.chars) for c in written[-1]] == [(SO_FAR, 0, len(SO_FAR))] * 2
        sources[1].text += MORE
        assert await ledger.progress.tick() == 0  # each is due ``every`` seconds after its last
        await asyncio.sleep(EVERY)
        assert await ledger.progress.tick() == 1  # the other had nothing new: nothing written
        (second,) = written[-1]
        assert (second.request_id, second.text, second.start) == ("r1", MORE, len(SO_FAR))  # what it added

        async def a_tick_failed_by(write: Any) -> None:
            await asyncio.sleep(EVERY)
            monkeypatch.setattr(store, "note_progress", write)
            with pytest.raises(StoreDown):
                await ledger.progress.tick()
            monkeypatch.setattr(store, "note_progress", spy)

        def down(progress: list[Checkpoint]) -> Any:
            raise StoreDown("the store is down")

        sources[0].text += THEN
        await a_tick_failed_by(down)
        assert await ledger.progress.tick() == 1  # what the failed write held, at the next tick
        (first,) = written[-1]
        assert (first.request_id, first.start) == ("r0", len(SO_FAR))
        assert first.text == THEN.replace("\x00", "\ufffd")  # (a NUL neither store takes as text)

        async def landed_then_failed(progress: list[Checkpoint]) -> Any:
            await real(progress)
            raise StoreDown("the reply was lost")

        sources[0].text += LAST
        await a_tick_failed_by(landed_then_failed)
        sources[0].text += MORE
        assert await ledger.progress.tick() == 1  # sent again from where the lost reply left it
        assert written[-1][0].text == LAST + MORE
    finally:
        await ledger.close()
        await store.close()
    # the process "dies" here: both streams are cut, each charged for its text as its checkpoints kept it
    records = await _recovered(store_url, [r.id for r in reservations])
    kept = {"r0": (SO_FAR + THEN + LAST + MORE).replace("\x00", "\ufffd"), "r1": SO_FAR + MORE}
    assert sorted(r.request_id or "" for r in records) == ["r0", "r1"]
    for record in records:
        completion = tokens.count(kept[record.request_id or ""])
        assert (record.completion_tokens, record.prompt_tokens) == (completion, tokens.count_request(
            {"messages": [{"role": "user", "content": "hi"}]}))  # fmt: skip
        usage = TokenUsage(prompt=record.prompt_tokens, completion=completion)
        assert record.credits == cost(MODEL.prices, usage) > 0
        assert record.status == "interrupted" and not record.usage_exact
        assert (record.deployment, record.metadata, record.stream) == ("d", '{"a":"b"}', True)  # the rest copied


async def _recovered(url: str, ids: list[int]) -> list[UsageRecord]:
    """What each store's recovery charges for the cut streams: SQLite at the next start, PostgreSQL when
    a replica releases the dead one's holds."""
    store = await _opened(url)
    try:
        if url.startswith("sqlite"):
            assert await store.recover_stopped() == 2
        else:
            from billing.postgres_ledger import release

            async with store.db.connection() as conn:  # type: ignore[attr-defined]
                assert await release(conn, ids, "the replica stopped") == 2
        return [r for r in await store.usage(group="g") if r.status == "interrupted"]
    finally:
        await store.close()


def test_a_charge_kept_as_a_whole_record_is_charged_as_it_is() -> None:
    """A checkpoint written before the text was kept (a record with its tokens and credits) is charged as
    it stands."""
    from billing.store import record_text

    record = UsageRecord(key_id=1, group_id=1, model="m", provider="p", completion_tokens=7, credits=70, ts=5.0)
    assert charged(record_text(record), "", None) == record


async def test_a_stream_whose_checkpoint_cannot_be_made_holds_back_no_other(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/router.db"
    store = await _opened(url)
    ledger = ledger_for(store, checkpoint=EVERY)
    await ledger.start(None)
    try:
        group = await store.create_group("g", 10**15)
        key = await store.create_key("g", "k", os.urandom(32).hex(), "hint")
        for n, prompt in enumerate(({"messages": [], "tools": [object()]}, {"messages": []})):  # (not JSON)
            reservation = await ledger.reserve(group.id, key.id, 10**9, Hold(MODEL.id, "openai", f"r{n}"))
            assert isinstance(reservation, Reservation)
            record = UsageRecord(key_id=key.id, group_id=group.id, model=MODEL.id, provider="openai", request_id=f"r{n}")
            meter = Meter(ledger, reservation, MODEL, record, prompt)
            meter.started -= 2.0
            meter.follow(source := Source())
            source.text = SO_FAR
        assert await ledger.progress.tick() == 1  # the other's, written
    finally:
        await ledger.close()
        await store.close()

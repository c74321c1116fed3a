"""billing/progress.py: a checkpoint writes the streams that generated something since the last one,
each ``every`` seconds apart, as the tokens each generated so far (no text: no call's content is kept);
a write the store failed is made again at the next tick, and one that seemed to fail but landed is not
counted twice; a stream cut after its checkpoints is charged the tokens they counted (on both stores,
through each store's own recovery)."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import msgspec
import pytest

from bench.checkpoints import MODEL, Source  # (a stream whose text the test grows)
from billing import progress, tokens
from billing.backends import open_store
from billing.ledger import Meter, ledger_for
from billing.pricing import cost
from billing.progress import Charge, _fields_of, charged
from billing.store import Checkpoint, Hold, Reservation, Store, StoreDown, UsageRecord
from core.config import StoreSettings
from core.wire import TokenUsage

SO_FAR, MORE, THEN, LAST = "the answer so far", " and more of it", ", then this \x00 é", " and the end"
PROMPT = {"messages": [{"role": "user", "content": "a question of its own"}]}
EVERY = 0.2


async def _opened(url: str) -> Store:
    store = open_store(url)
    await store.open()
    await store.serve(StoreSettings(url=url))
    return store


async def _followed(
    store: Store,
    ledger: Any,
    prompts: list[dict[str, Any]],
    source: type[Source] = Source,
    provider: str = "openai",
    **fields: Any,
) -> list[tuple[Meter, Source]]:
    """A stream of group "g" for each of ``prompts`` (request ids r0, r1, ...), each followed by the
    ledger's checkpoints with a ``source`` the test grows, and old enough that its first one is due."""
    group = await store.create_group("g", 10**15)
    key = await store.create_key("g", "k", os.urandom(32).hex(), "hint")
    streams = []
    for n, prompt in enumerate(prompts):
        reservation = await ledger.reserve(group.id, key.id, 10**9, Hold(MODEL.id, provider, f"r{n}"))
        assert isinstance(reservation, Reservation)
        record = UsageRecord(
            key_id=key.id, group_id=group.id, model=MODEL.id, provider=provider, request_id=f"r{n}", **fields
        )
        meter = Meter(ledger, reservation, MODEL, record, prompt)
        meter.started -= 2.0  # old enough to be due
        meter.follow(followed := source())
        streams.append((meter, followed))
    return streams


async def test_checkpoints_keep_the_tokens_generated_and_a_cut_stream_is_charged_them(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens.encoding()  # loaded before, as the gateway does at its start (a tick must take less than EVERY)
    store = await _opened(store_url)
    ledger = ledger_for(store, checkpoint=EVERY)
    await ledger.start(None)
    reservations: list[Reservation] = []
    try:
        streams = await _followed(
            store, ledger, [PROMPT, PROMPT], stream=True, deployment="d", metadata='{"a":"b"}'
        )
        reservations = [meter.reservation for meter, _ in streams]
        sources = [source for _, source in streams]
        written: list[list[Checkpoint]] = []
        real = store.note_progress

        def spy(progress: list[Checkpoint]) -> Any:
            written.append(progress)
            return real(progress)

        monkeypatch.setattr(store, "note_progress", spy)
        sources[0].text = sources[1].text = SO_FAR
        assert await ledger.progress.tick() == 2
        assert [(c.request_id, c.completion) for c in written[-1]] == [
            ("r0", count(SO_FAR)),
            ("r1", count(SO_FAR)),
        ]
        sources[1].text += MORE
        assert await ledger.progress.tick() == 0  # each is due ``every`` seconds after its last
        await asyncio.sleep(EVERY)
        assert await ledger.progress.tick() == 1  # the other had nothing new: nothing written
        (second,) = written[-1]
        assert (second.request_id, second.completion, second.charge) == (
            "r1",
            count(SO_FAR) + count(MORE),
            None,
        )

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
        assert (first.request_id, first.completion) == ("r0", count(SO_FAR) + count(THEN))

        async def landed_then_failed(progress: list[Checkpoint]) -> Any:
            await real(progress)
            raise StoreDown("the reply was lost")

        sources[0].text += LAST
        await a_tick_failed_by(landed_then_failed)
        sources[0].text += MORE
        assert await ledger.progress.tick() == 1  # counted again from where the lost reply left it
        assert written[-1][0].completion == count(SO_FAR) + count(THEN) + count(LAST + MORE)
        for checkpoint in (
            c for tick in written for c in tick
        ):  # no content: neither the prompt nor the text
            assert not any(
                part in (checkpoint.charge or "") for part in ("a question", "the answer", "more of it")
            )
    finally:
        await ledger.close()
        await store.close()
    # the process "dies" here: both streams are cut, each charged the tokens its checkpoints counted
    records = await _recovered(store_url, [r.id for r in reservations])
    kept = {"r0": count(SO_FAR) + count(THEN) + count(LAST + MORE), "r1": count(SO_FAR) + count(MORE)}
    assert sorted(r.request_id or "" for r in records) == ["r0", "r1"]
    for record in records:
        completion = kept[record.request_id or ""]
        assert (record.completion_tokens, record.prompt_tokens) == (completion, tokens.count_request(PROMPT))
        usage = TokenUsage(prompt=record.prompt_tokens, completion=completion)
        assert record.credits == cost(MODEL.prices, usage) > 0
        assert record.status == "interrupted" and not record.usage_exact
        assert (record.deployment, record.metadata, record.stream) == (
            "d",
            '{"a":"b"}',
            True,
        )  # the rest copied


def count(text: str) -> int:
    return tokens.count(text)


async def _recovered(url: str, ids: list[int], cut: int = 2) -> list[UsageRecord]:
    """What each store's recovery charges for the cut streams: SQLite at the next start, PostgreSQL when
    a replica releases the dead one's holds."""
    store = await _opened(url)
    try:
        if url.startswith("sqlite"):
            assert await store.recover_stopped() == cut
        else:
            from billing.postgres_ledger import release

            async with store.db.connection() as conn:  # type: ignore[attr-defined]
                assert await release(conn, ids, "the replica stopped") == cut
        return [r for r in await store.usage(group="g") if r.status == "interrupted"]
    finally:
        await store.close()


def test_a_charge_kept_as_a_whole_record_is_charged_as_it_is() -> None:
    """A checkpoint written before the text was kept (a record with its tokens and credits) is charged as
    it stands."""
    from billing.store import record_text

    record = UsageRecord(
        key_id=1, group_id=1, model="m", provider="p", completion_tokens=7, credits=70, ts=5.0
    )
    assert charged(record_text(record), 0, None) == record


def test_a_charge_kept_with_its_texts_is_charged_their_tokens() -> None:
    """A checkpoint written while checkpoints kept the text (the prompt's texts in the charge, the text
    beside it) is charged those texts' tokens, with the tokens counted since."""
    record = UsageRecord(key_id=1, group_id=1, model=MODEL.id, provider="openai", request_id="r")
    texts = tokens.prompt_texts(PROMPT)
    kept = Charge(_fields_of(record), 1.0, 10**9, MODEL.prices, prompt=texts)
    cut = charged(msgspec.json.encode(kept), 3, 2.0, SO_FAR)
    assert (cut.prompt_tokens, cut.completion_tokens) == (tokens.count_request(PROMPT), 3 + count(SO_FAR))
    assert (cut.ts, cut.latency_ms, cut.status) == (2.0, 1000.0, "interrupted")


async def test_a_stream_whose_checkpoint_cannot_be_made_holds_back_no_other(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/router.db"
    store = await _opened(url)
    ledger = ledger_for(store, checkpoint=EVERY)
    await ledger.start(None)
    try:
        for _, source in await _followed(
            store, ledger, [{"messages": [], "tools": [object()]}, {"messages": []}]
        ):
            source.text = SO_FAR  # (the first one's tools are not JSON)
        assert await ledger.progress.tick() == 1  # the other's, written
    finally:
        await ledger.close()
        await store.close()


async def test_a_slice_with_much_to_count_is_counted_off_the_event_loop(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice with more than ``INLINE`` characters to count (here a long prompt) is counted on a worker
    thread; a stream settled meanwhile is left out; the other is charged its prompt as counted."""
    url = f"sqlite:///{tmp_path}/router.db"
    store = await _opened(url)
    ledger = ledger_for(store, checkpoint=EVERY)
    await ledger.start(None)
    long = {"messages": [{"role": "user", "content": "a long question " * 5000}]}
    tokens._kept.clear()  # (its count not kept from before: it is counted now)
    try:
        streams = await _followed(store, ledger, [long, PROMPT])
        for _, source in streams:
            source.text = SO_FAR
        threads = []

        def counted(parts: list[Any]) -> Any:
            threads.append(threading.current_thread() is threading.main_thread())
            streams[1][0].finished = True  # (its settlement queued while the count ran)
            return real(parts)

        real = progress._counted
        monkeypatch.setattr(progress, "_counted", counted)
        assert await ledger.progress.tick() == 1
        assert threads == [False]  # (the event loop's thread is the main one)
    finally:
        await ledger.close()
        await store.close()
    (record,) = await _recovered(url, [], 1)
    assert (record.request_id, record.prompt_tokens, record.completion_tokens) == (
        "r0",
        tokens.count_request(long),
        count(SO_FAR),
    )


async def test_text_kept_by_an_earlier_version_is_charged_at_recovery(store_url: str) -> None:
    """A stream cut while checkpoints kept its text (SQLite's ``in_progress_text`` rows, PostgreSQL's
    ``progress_text``; no count) is charged that text's tokens and its kept prompt's by the recovery."""
    store = await _opened(store_url)
    try:
        group = await store.create_group("g", 10**15)
        key = await store.create_key("g", "k", os.urandom(32).hex(), "hint")
        ledger = ledger_for(store)
        reservation = await ledger.reserve(group.id, key.id, 10**9, Hold(MODEL.id, "openai", "r0"))
        assert isinstance(reservation, Reservation)
        record = UsageRecord(
            key_id=key.id, group_id=group.id, model=MODEL.id, provider="openai", request_id="r0"
        )
        charge = msgspec.json.encode(
            Charge(_fields_of(record), 1.0, 10**9, MODEL.prices, prompt=tokens.prompt_texts(PROMPT))
        ).decode()
        if store_url.startswith("sqlite"):

            def old(db: Any) -> None:
                db.execute(
                    "INSERT INTO in_progress (reservation, request_id, record) VALUES (?, 'r0', ?)",
                    (reservation.id, charge),
                )
                db.executemany(
                    "INSERT INTO in_progress_text (reservation, start, text, at) VALUES (?, ?, ?, ?)",
                    [(reservation.id, 0, SO_FAR, 2.0), (reservation.id, len(SO_FAR), MORE, 3.0)],
                )

            await store.run(old)  # type: ignore[attr-defined]
        else:
            async with store.db.connection() as conn:  # type: ignore[attr-defined]
                await conn.execute(
                    "UPDATE reservations SET progress = $1, progress_text = $2, progress_chars = $3, "
                    "progress_at = 3.0 WHERE id = $4",
                    charge,
                    SO_FAR + MORE,
                    len(SO_FAR + MORE),
                    reservation.id,
                )
    finally:
        await store.close()
    (cut,) = await _recovered(store_url, [reservation.id], 1)
    assert (cut.prompt_tokens, cut.completion_tokens, cut.ts) == (
        tokens.count_request(PROMPT),
        count(SO_FAR + MORE),
        3.0,
    )


async def test_a_stream_whose_upstream_reported_its_usage_is_charged_that_uncounted(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream whose upstream reports its usage as it goes (Gemini's) is charged that usage: its text is
    not counted."""
    url = f"sqlite:///{tmp_path}/router.db"
    store = await _opened(url)
    ledger = ledger_for(store, checkpoint=EVERY)
    await ledger.start(None)
    reported = TokenUsage(prompt=11, completion=13)

    class Reporting(Source):
        def reported(self) -> tuple[TokenUsage | None, TokenUsage | None]:
            return reported, TokenUsage(prompt=11)

    try:
        ((_, source),) = await _followed(store, ledger, [PROMPT], Reporting, provider="gemini")
        source.text = SO_FAR
        monkeypatch.setattr(
            tokens, "encoding", lambda: pytest.fail("counted")
        )  # (an empty text needs no tokenizer)
        assert await ledger.progress.tick() == 1
    finally:
        await ledger.close()
        await store.close()
    monkeypatch.undo()
    (cut,) = await _recovered(url, [], 1)
    assert (cut.prompt_tokens, cut.completion_tokens, cut.credits) == (11, 13, cost(MODEL.prices, reported))

"""server/channels.py against asyncio's own: the same generated programs of puts, gets, waits, sets,
clears, loop turns and cancellations run on ``asyncio.Queue`` / hypercorn's ``EventWrapper`` and on
``Channel`` / ``Event``, and everything a caller can see (which call has finished, with what, and in
which turn; the queue's length; the event's flag) is compared after every step. Then the whole of it
through a real hypercorn server: a request body in more pieces than the queue holds, read by an app
that takes its time, arrives whole and in order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hypercorn.asyncio.worker_context import EventWrapper
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.types import RECEIVE_WATCH
from server import channels
from tests.conftest import hypercorn_on

# the calls a program makes, as often as each other; a cancellation names one of the last few calls
_CANCELS = [("cancel", back) for back in range(1, 5)]
_queue_ops = st.lists(st.sampled_from([("put",), ("get",), ("turn",), *_CANCELS]), max_size=40)


def _states(tasks: list[asyncio.Task[Any]]) -> list[Any]:
    out: list[Any] = []
    for task in tasks:
        if not task.done():
            out.append("pending")
        elif task.cancelled():
            out.append("cancelled")
        elif task.exception() is not None:
            out.append(("raised", type(task.exception()).__name__))
        else:
            out.append(("returned", task.result()))
    return out


def _run(thing: Any, ops: list[tuple[Any, ...]], state: Callable[[Any], tuple[Any, ...]]) -> list[Any]:
    """Run ``ops`` on ``thing`` (each call a task: ``put`` puts its step's number; a cancellation names
    one of the last few calls; ``turn`` lets the loop run once) and what callers see after each step."""

    async def program() -> list[Any]:
        tasks: list[asyncio.Task[Any]] = []
        seen: list[Any] = []
        for step, op in enumerate(ops):
            if op[0] == "cancel":
                if tasks:
                    tasks[-min(op[1], len(tasks))].cancel()
            elif op[0] == "turn":
                await asyncio.sleep(0)
            else:
                method = getattr(thing, op[0])
                tasks.append(asyncio.ensure_future(method(step) if op[0] == "put" else method()))
            seen.append((_states(tasks), *state(thing)))
        for _ in range(3):  # let what was woken finish
            await asyncio.sleep(0)
        seen.append((_states(tasks), *state(thing)))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return seen

    return asyncio.run(program())


def _run_queue(make: Any, maxsize: int, ops: list[tuple[Any, ...]]) -> list[Any]:
    return _run(make(maxsize), ops, lambda queue: (queue.qsize(), queue.full()))


# a waiter woken and then cancelled before it ran hands its wake-up on to the next one
_HAND_ON_GET = [("get",), ("get",), ("turn",), ("put",), ("turn",), ("cancel", 3), ("turn",)]
_HAND_ON_PUT = [("put",), ("put",), ("put",), ("turn",), ("get",), ("turn",), ("cancel", 3), ("turn",)]


@settings(max_examples=400, deadline=None)
@given(maxsize=st.integers(0, 3), ops=_queue_ops)
@example(maxsize=0, ops=_HAND_ON_GET)
@example(maxsize=1, ops=_HAND_ON_PUT)
def test_a_channel_is_asyncio_queue_to_its_callers(maxsize: int, ops: list[tuple[Any, ...]]) -> None:
    assert _run_queue(channels.Channel, maxsize, ops) == _run_queue(asyncio.Queue, maxsize, ops)


_event_ops = st.lists(st.sampled_from([("wait",), ("set",), ("clear",), ("turn",), *_CANCELS]), max_size=40)


def _run_event(make: Any, ops: list[tuple[Any, ...]]) -> list[Any]:
    return _run(make(), ops, lambda event: (event.is_set(),))


@settings(max_examples=400, deadline=None)
@given(ops=_event_ops)
def test_an_event_is_hypercorns_to_its_callers(ops: list[tuple[Any, ...]]) -> None:
    assert _run_event(channels.Event, ops) == _run_event(EventWrapper, ops)


def test_a_body_in_more_pieces_than_the_queue_holds_arrives_whole_through_hypercorn() -> None:
    channels.install()
    pieces = [bytes([65 + i % 26]) * (100 + i) for i in range(200)]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        got = bytearray()
        while True:
            await asyncio.sleep(0.001)  # slower than the client: the queue fills and the connection waits
            message = await receive()
            got += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(got))]}
        )
        await send({"type": "http.response.body", "body": bytes(got)})

    async def main() -> bytes:
        async with hypercorn_on(app) as (reader, writer):
            writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
            for piece in pieces:
                writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            return await reader.readexactly(length)

    assert asyncio.run(main()) == b"".join(pieces)
    from hypercorn.asyncio.task_group import TaskGroup
    from hypercorn.asyncio.worker_context import WorkerContext

    assert TaskGroup.spawn_app is channels.spawn_app
    assert WorkerContext.event_class is channels.Event


def test_the_scope_offers_the_channels_watch_and_it_hears_the_callers_disconnect_through_hypercorn() -> None:
    """The seam between the server and the app (core.types.RECEIVE_WATCH): an app that watches
    hears the caller go without a task waiting on ``receive``."""
    channels.install()
    heard: list[str] = []
    gone = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()  # the request's (empty) body

        def hear(message: Any) -> None:
            heard.append(message["type"])
            gone.set()

        offer = scope["extensions"][RECEIVE_WATCH]
        offer["watch"](hear)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await asyncio.wait_for(gone.wait(), 5)
        offer["watch"](None)

    async def main() -> None:
        async with hypercorn_on(app) as (reader, writer):
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            await reader.readuntil(b"data: 1")
            writer.close()
            await asyncio.wait_for(gone.wait(), 5)

    asyncio.run(main())
    assert heard == ["http.disconnect"]


def test_a_watched_channel_hands_every_item_on_as_it_comes_and_none_to_get() -> None:
    async def program() -> tuple[list[Any], list[Any], Any]:
        channel = channels.Channel(2)
        await channel.put("a")
        await channel.put("b")
        blocked = asyncio.ensure_future(channel.put("c"))  # the channel is full: waits
        await asyncio.sleep(0)
        seen: list[Any] = []
        channel.watch(seen.append)  # those waiting first, in order
        await channel.put("d")
        await asyncio.sleep(0)  # the blocked put runs: to the watcher too
        getter = asyncio.ensure_future(channel.get())
        await channel.put("e")
        await asyncio.sleep(0)
        before_unwatch = list(seen)
        got_nothing = not getter.done()
        channel.watch(None)
        await channel.put("f")
        await asyncio.sleep(0)
        await blocked
        return before_unwatch, [got_nothing, channel.qsize()], getter.result()

    seen, state, got = asyncio.run(program())
    assert seen == ["a", "b", "d", "c", "e"]
    assert state == [True, 0]
    assert got == "f"

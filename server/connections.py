"""Client connections under hypercorn: closed as soon as the client has gone, and bounded in number.

Two things hypercorn 0.18 does not do, which let one client exhaust the process:

- **A client's EOF on an idle connection.** hypercorn's ``TCPServer.run`` leaves its task group only
  when every task in it has ended, and the keep-alive timer is one of them: a connection the client
  closed while idle kept its socket (CLOSE-WAIT) for ``keep_alive_timeout`` (75 s). 20,000
  connect-then-close cycles in 17 s took the process to its descriptor limit, and every request,
  ``/healthz`` included, got an empty reply. :class:`GuardedTCPServer` stops the keep-alive timer as
  soon as the reading loop sees the end of the stream.
- **How many connections.** There is no cap: each idle connection costs memory (~25 KB) and a
  descriptor, and a call in flight a second descriptor (its upstream). :class:`Limits` caps both the
  open connections (``[server] max_connections``, by default what the descriptor limit allows with
  an upstream socket per connection) and the idle ones (``max_idle_connections``: open, no request in
  flight, a request head not yet complete included). An HTTP/2 connection carries up to 100 calls
  at once, each with its upstream socket: its calls besides the first count one descriptor each
  against the same budget (two per connection); idle connections are closed to make room for one as
  for a new connection, and when none is idle it is answered 503 with ``Retry-After`` without
  reaching the gateway. A new connection over either cap first closes
  the connection idle the longest (an HTTP/1.1 client expects an idle connection to be closed and
  opens another); when every connection is busy it is answered ``503`` with ``Retry-After`` and
  closed. So a flood of idle or half-open connections cannot shut out a real caller or ``/healthz``.

And one it does at a price: its keep-alive timer is a task per idle period (with a ``wait_for`` and
its inner task), cancelled and awaited at the next request, about a twelfth of a call's instructions;
:class:`_IdleTimer` keeps the same timeout and the same shutdown behaviour with one timer handle.

hypercorn builds its ``TCPServer`` by name in ``hypercorn.asyncio.run``; :func:`install` puts ours
there (once per process: descriptors are the process's).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
import weakref
from ssl import SSLError
from typing import Any

import hypercorn.asyncio.run as hypercorn_run
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.asyncio.tcp_server import MAX_RECV, TCPServer
from hypercorn.events import Closed, RawData
from hypercorn.protocol.h2 import H2Protocol

from core import metrics

log = logging.getLogger("server.connections")

# descriptors kept for what is not a client connection: the listening socket, the store, logs, the
# emulators of the demo, the interpreter's own
RESERVED_FDS = 64
_REFUSAL_BODY = (
    b'{"error":{"message":"The server has too many open connections; retry shortly.",'
    b'"type":"server_error","param":null,"code":"too_many_connections"}}'
)
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%b" % (len(_REFUSAL_BODY), _REFUSAL_BODY)
)


def default_max_connections() -> int:
    """What the descriptor limit allows: a client socket and an upstream socket per connection."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1_048_576
    return max((soft - RESERVED_FDS) // 2, 16)


class Limits:
    """The process's client connections: every open one, and the idle ones oldest first."""

    def __init__(self, max_connections: int, max_idle: int) -> None:
        self.max_connections = max_connections
        self.max_idle = max_idle
        self.open: set[GuardedTCPServer] = set()
        self.idle: dict[GuardedTCPServer, None] = {}  # insertion order: idle the longest first
        self.extra_streams = 0  # HTTP/2 calls in flight besides the first of their connection
        self.evicted = 0
        self.refused = 0

    def _full(self, more: int = 2) -> bool:
        """Whether ``more`` descriptors would go past the budget: a connection is two (its socket and
        its call's upstream socket), each extra HTTP/2 stream one (its upstream socket)."""
        return 2 * len(self.open) + self.extra_streams + more > 2 * self.max_connections

    def admit(self, conn: GuardedTCPServer) -> bool:
        """Make room for ``conn`` (closing the connection idle the longest if a cap is reached);
        False if every open connection is busy and there is no room."""
        while self._full() or len(self.idle) >= self.max_idle:
            if not self.idle:
                if not self._full():
                    break  # only the idle cap was reached, and nothing is idle any more
                self.refused += 1
                return False
            self._evict_oldest()
        self.open.add(conn)
        self.idle[conn] = None  # a new connection is idle until its first request arrives
        return True

    def _evict_oldest(self) -> None:
        oldest = next(iter(self.idle))
        self.quiet(oldest)
        self.open.discard(oldest)
        self.evicted += 1
        oldest.evict()

    def busy(self, conn: GuardedTCPServer) -> None:
        self.idle.pop(conn, None)

    def quiet(self, conn: GuardedTCPServer) -> None:
        """``conn`` has ended, or is to be closed: no longer a candidate for eviction."""
        self.idle.pop(conn, None)

    def resting(self, conn: GuardedTCPServer) -> None:
        if conn in self.open:
            self.idle[conn] = None

    def leave(self, conn: GuardedTCPServer) -> None:
        self.open.discard(conn)
        self.idle.pop(conn, None)

    def stream_opens(self) -> bool:
        """Room for one more HTTP/2 call on a connection that has one in flight already (closing the
        connections idle the longest to make it, as for a new connection)."""
        while self._full(1):
            if not self.idle:
                self.refused += 1
                return False
            self._evict_oldest()
        self.extra_streams += 1
        return True

    def stream_ends(self) -> None:
        self.extra_streams -= 1


async def _refuse(scope: Any, receive: Any, send: Any) -> None:
    """The answer to an HTTP/2 call over the descriptor budget: what an HTTP/1.1 connection gets."""
    if scope["type"] == "http":
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")],
            }
        )
        await send({"type": "http.response.body", "body": _REFUSAL_BODY})


REFUSING = ASGIWrapper(_refuse)
ORIGINAL_CREATE_H2_STREAM = H2Protocol._create_stream
ORIGINAL_CLOSE_H2_STREAM = H2Protocol._close_stream


async def create_h2_stream(self: Any, request: Any) -> None:
    """An HTTP/2 stream, counted against the descriptor budget when its connection has a call in
    flight already (the first is the connection's own); over the budget it is answered 503 with
    ``Retry-After`` without reaching the gateway."""
    if _limits is None or not self.streams:
        return await ORIGINAL_CREATE_H2_STREAM(self, request)
    if _limits.stream_opens():
        self.__dict__.setdefault("counted_streams", set()).add(request.stream_id)
        return await ORIGINAL_CREATE_H2_STREAM(self, request)
    app, self.app = self.app, REFUSING
    try:
        await ORIGINAL_CREATE_H2_STREAM(self, request)
    finally:
        self.app = app


async def close_h2_stream(self: Any, stream_id: int) -> None:
    counted = self.__dict__.get("counted_streams")
    if counted and stream_id in counted:
        counted.discard(stream_id)
        if _limits is not None:
            _limits.stream_ends()
    await ORIGINAL_CLOSE_H2_STREAM(self, stream_id)


_limits: Limits | None = None


class _IdleTimer:
    """hypercorn's keep-alive timer of one connection, which runs exactly while the connection is
    idle: its starts and stops tell :class:`Limits` which connections may be closed to make room
    (without a hook on every event the connection sends).

    hypercorn runs it as a task per idle period (a ``wait_for`` on the shutdown event, with its own
    inner task and timer), cancelled and awaited when the next request comes: about a twelfth of the
    instructions of a call. Here an idle period is one timer handle (``loop.call_later``), cancelled
    when the connection is busy again; when it fires, or when the worker shuts down while the
    connection is idle (``context.terminated`` set), the connection is closed as hypercorn's timer
    closes it (``_initiate_server_close``, shielded: a close once begun completes)."""

    __slots__ = ("conn", "_handle")

    def __init__(self, conn: GuardedTCPServer) -> None:
        self.conn = conn
        self._handle: asyncio.TimerHandle | None = None

    async def restart(self, task_group: Any, action: Any) -> None:
        if _limits is not None:
            _limits.resting(self.conn)
        if self._handle is not None:
            self._handle.cancel()
        context = self.conn.context
        if context.terminated.is_set():
            self._handle = None
            self.fire()
            return
        self._handle = asyncio.get_running_loop().call_later(self.conn.config.keep_alive_timeout, self.fire)
        _idle_of(context).add(self)

    async def stop(self) -> None:
        if _limits is not None:
            _limits.busy(self.conn)
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            _idle_of(self.conn.context).discard(self)

    def fire(self) -> None:
        """The connection has been idle for ``keep_alive_timeout``, or the worker is shutting down."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        _idle_of(self.conn.context).discard(self)
        task = asyncio.ensure_future(asyncio.shield(self.conn._initiate_server_close()))
        _closing.add(task)
        task.add_done_callback(_closing.discard)


_closing: set[asyncio.Future[Any]] = set()  # closes under way (a reference keeps each task alive)
# a worker context -> the timers of its idle connections
_idle: weakref.WeakKeyDictionary[Any, set[_IdleTimer]] = weakref.WeakKeyDictionary()


def _idle_of(context: Any) -> set[_IdleTimer]:
    """The idle timers of ``context``'s connections; the first time, its shutdown event is made to
    close them when it is set (hypercorn sets it once, when the worker stops)."""
    timers = _idle.get(context)
    if timers is None:
        timers = _idle[context] = set()
        terminated = context.terminated
        set_event = terminated.set

        async def set_and_close() -> None:
            await set_event()
            for timer in list(timers):
                timer.fire()

        terminated.set = set_and_close
    return timers


class GuardedTCPServer(TCPServer):
    """hypercorn's connection, which lets go of its socket when the client has gone and counts in
    the process's :class:`Limits`."""

    async def run(self) -> None:
        limits = _limits
        if limits is not None and not limits.admit(self):
            await self._refuse()
            return
        try:
            await super().run()
        finally:
            if limits is not None:
                limits.leave(self)

    async def _read_data(self) -> None:
        """hypercorn's reading loop (each read handed to the protocol until the end of the stream),
        with two coroutines fewer waiting in every open connection: hypercorn awaits each read through
        ``asyncio.wait_for``, which with no ``read_timeout`` (the gateway sets none) only awaits it, and
        this method called hypercorn's through ``super()``. Then the keep-alive timer is stopped: the
        client has gone (or the connection was closed), and the timer would hold the task group, and
        with it the socket, for ``keep_alive_timeout``."""
        reader, handle, timeout = self.reader, self.protocol.handle, self.config.read_timeout
        while not reader.at_eof():
            try:
                if timeout is None:
                    data = await reader.read(MAX_RECV)
                else:
                    data = await asyncio.wait_for(reader.read(MAX_RECV), timeout)
            except (
                ConnectionError,
                OSError,
                TimeoutError,
                SSLError,
            ):  # (asyncio.TimeoutError is TimeoutError)
                break
            else:
                await handle(RawData(data))
        await handle(Closed())
        await self.idle_task.stop()

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.idle_task = _IdleTimer(self)  # type: ignore[assignment]  # (hypercorn's restart/stop, without a task)
        # asyncio's stream protocol keeps the writers waiting for the socket to drain in a deque (~760
        # bytes, made for every connection) and only appends, removes and iterates: a list does the same
        protocol = getattr(self.writer, "_protocol", None)
        waiters = getattr(protocol, "_drain_waiters", None)
        if type(waiters) is collections.deque and not waiters:
            setattr(protocol, "_drain_waiters", [])  # noqa: B010 (an attribute of asyncio's, not typed)

    async def protocol_send(self, event: Any) -> None:
        """hypercorn's, with its common case in one step: data to write while no other write waits and
        the socket keeps up goes to the transport without the lock's and ``drain``'s four coroutines,
        which would then do nothing. The rest (a write under way, the connection closing, the socket
        pushing back after this write) takes hypercorn's way, which waits for the socket to drain."""
        if event.__class__ is RawData and not self.send_lock.locked():
            transport = self.writer.transport
            if not transport.is_closing():
                try:
                    transport.write(event.data)
                    if not getattr(getattr(self.writer, "_protocol", None), "_paused", True):
                        return
                    async with self.send_lock:  # (what hypercorn's waits for after its write)
                        await self.writer.drain()
                except (ConnectionError, RuntimeError):
                    await self.protocol.handle(Closed())
                return
        await super().protocol_send(event)

    def evict(self) -> None:
        """Close this idle connection to make room for a new one: its reading loop sees the end."""
        self.writer.close()

    async def _refuse(self) -> None:
        try:
            self.writer.write(REFUSAL)
            self.writer.close()
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)
        except (OSError, RuntimeError, TimeoutError):
            pass


def install(max_connections: int, max_idle: int) -> Limits:
    """Serve hypercorn's connections as :class:`GuardedTCPServer` under these caps (0: the default
    for ``max_connections``; for ``max_idle``, ``max_connections``: a new connection counts as idle
    until its request head is in, so a lower idle cap also cuts a burst of callers opening at once).
    The last call's caps apply to the whole process."""
    global _limits
    most = max_connections or default_max_connections()
    limits = Limits(most, max_idle or most)
    if _limits is not None:  # a second gateway in one process: the connections stay counted
        limits.open, limits.idle = _limits.open, _limits.idle
        limits.extra_streams = _limits.extra_streams
    _limits = limits
    setattr(hypercorn_run, "TCPServer", GuardedTCPServer)  # noqa: B010 - a module attribute of hypercorn, replaced on purpose
    setattr(H2Protocol, "_create_stream", create_h2_stream)  # noqa: B010
    setattr(H2Protocol, "_close_stream", close_h2_stream)  # noqa: B010
    metrics.watch_connections(limits)
    return limits

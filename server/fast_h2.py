"""hypercorn's HTTP/2 sending, with the common case of a streamed answer sent at once.

hypercorn hands every body chunk of an HTTP/2 stream to a per-connection sending task: the chunk is
appended to the stream's buffer, the stream unblocked in a ``priority.PriorityTree`` and the task
woken, which then walks the tree, pops the buffer, frames the data and writes it, and walks the tree
again to find the stream empty and block it. For an SSE answer (one small chunk at a time, each
written before the next exists) that is the whole cost of a chunk twice over: with 2,000 streams on
20 connections at 10,000 chunks a second, the sending task was 41 % of the gateway's time
(``py-spy``), and an HTTP/2 chunk cost 95 µs against HTTP/1.1's 72.

:func:`stream_send` sends a chunk itself when nothing of its stream is waiting in the buffer and the
chunk fits both flow-control windows and one frame, which is exactly when the sending task would send
it as one frame next; anything else (a large body, a window the client has not opened, a chunk behind
others) takes hypercorn's own path unchanged. The order of a stream's frames holds: a stream's buffer
is empty only once the task has handed all of it to the h2 connection (``StreamBuffer.pop`` does not
suspend between taking the bytes and ``send_data``), and writes to the socket are serialised in order
by the connection's send lock. Once the connection is gone a chunk is dropped, as hypercorn's stopped
sending task drops it (not written to the closed socket). The end of a stream, trailers and headers
stay hypercorn's.
Prioritisation among streams only ever applied to data waiting in buffers, and still does.

``tests/test_fast_h2.py`` runs concurrent streams of generated chunk sizes through a real hypercorn
with and without it, under a client window small enough to force the buffered path midway, and
compares what the client receives. :func:`install` is called by ``server.serve``.
"""

from __future__ import annotations

from typing import Any

import h2.exceptions
from hypercorn.protocol.events import Body, Data
from hypercorn.protocol.h2 import H2Protocol

ORIGINAL_STREAM_SEND = H2Protocol.stream_send


async def stream_send(self: Any, event: Any) -> None:
    kind = type(event)
    if kind is Body or kind is Data:
        if self.closed:
            return  # the connection is gone (hypercorn's sending task has stopped: it drops the chunk too)
        buffer = self.stream_buffers.get(event.stream_id)
        if buffer is not None and not buffer.buffer and not buffer._complete:
            data = event.data
            connection = self.connection
            try:
                fits = len(data) <= connection.max_outbound_frame_size and len(
                    data
                ) <= connection.local_flow_control_window(event.stream_id)
                if fits:
                    if data:  # (hypercorn's task sends no frame for an empty chunk either)
                        connection.send_data(event.stream_id, data)
                        await self._flush()
                    return
            except h2.exceptions.ProtocolError:
                return  # the stream or the connection has closed: hypercorn's own drops the chunk too
    await ORIGINAL_STREAM_SEND(self, event)


def install() -> None:
    setattr(H2Protocol, "stream_send", stream_send)  # noqa: B010

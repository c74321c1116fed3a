"""Server-Sent Events: an incremental decoder for upstream streams and the framing of our own events.

The decoder follows the WHATWG event-stream grammar (docs/providers.md, Server-sent events): CRLF, LF and lone CR
all end a line, also when a CR ends one network read and its LF starts the next; a blank line
dispatches; ``:`` lines are comments; several ``data:`` lines join with ``\\n``. It works on bytes:
lines are split at ASCII terminators, which never occur inside a UTF-8 multi-byte sequence, so a
character split across two reads is reassembled before anyone decodes it.
"""

from __future__ import annotations

from typing import NamedTuple


class Event(NamedTuple):
    event: str | None
    data: bytes


class SSEDecoder:
    __slots__ = ("_buf", "_data", "_event", "_rest")

    def __init__(self) -> None:
        self._buf = b""  # the start of a line not ended yet
        self._rest: list[bytes] = []  # reads since, with no line end in them (a long line, in many reads)
        self._data: list[bytes] = []
        self._event: str | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        # (``find``, not ``in``: on Python 3.11 ``bytes in bytes`` first tries its operand as an int, and
        # raises and clears a TypeError each time, ~2k instructions; up to three of them a read)
        if chunk.find(b"\n") < 0 and chunk.find(b"\r") < 0 and not self._buf.endswith(b"\r"):
            # the middle of a long line (a Response object with its tools' echo comes in many reads):
            # kept as it came, not joined and split again on each read
            self._rest.append(chunk)
            return []
        if self._rest:
            buf = b"".join((self._buf, *self._rest, chunk))
            self._rest = []
        else:
            buf = self._buf + chunk if self._buf else chunk
        if buf.find(b"\r") >= 0:
            # keep a trailing CR back: its LF may arrive in the next read
            tail = b"\r" if buf.endswith(b"\r") else b""
            if tail:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + tail
        events: list[Event] = []
        if self._data or self._event is not None:  # an event begun in an earlier read: its lines to its end
            if buf[:1] == b"\n":
                end = 0
            else:
                end = buf.find(b"\n\n")
                if end < 0:
                    return self._lines(buf, events)
                for line in buf[:end].split(b"\n"):  # (the rest of a long line: split copies nothing more)
                    self._line(line, events)
                end += 1
            self._line(b"", events)
            buf = buf[end + 1 :]
        blocks = buf.split(b"\n\n")  # (no copy when there is none)
        if len(blocks) > 1:
            # at an event boundary: whole events at once, the common ones (a single `data: ` line, or an
            # `event: ` line and a `data: ` line) without going line by line
            buf = blocks.pop()  # what follows the last complete event
            for block in blocks:
                if block[:6] == b"data: " and block.find(b"\n") < 0:
                    events.append(Event(None, block[6:]))
                    continue
                if block[:7] == b"event: ":
                    at = block.find(b"\n")
                    if at > 0 and block[at + 1 : at + 7] == b"data: " and block.find(b"\n", at + 1) < 0:
                        events.append(Event(block[7:at].decode("utf-8", "replace"), block[at + 7 :]))
                        continue
                for line in block.split(b"\n"):
                    self._line(line, events)
                self._line(b"", events)
        return self._lines(buf, events)

    def _lines(self, buf: bytes, events: list[Event]) -> list[Event]:
        """``buf``'s lines read, its last (not ended yet) kept for the next read."""
        if buf.find(b"\n") < 0:  # (the start of a line, often a long one: not split)
            self._buf = buf
            return events
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        for line in lines:
            self._line(line, events)
        return events

    def close(self) -> list[Event]:
        """End of stream: flush a pending line and a pending event (lenient, as Gemini's SDK is)."""
        events: list[Event] = []
        if self._rest:
            self._buf = b"".join((self._buf, *self._rest))
            self._rest = []
        if self._buf:
            self._line(self._buf.rstrip(b"\r"), events)
            self._buf = b""
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[Event]) -> None:
        if not line:
            if self._data or self._event is not None:
                events.append(Event(self._event, b"\n".join(self._data)))
            self._data = []
            self._event = None
            return
        if line[:6] == b"data: ":  # (most lines: one copy of the data)
            self._data.append(line[6:])
            return
        if line[0] == 0x3A:  # ':' comment / keep-alive
            return
        field, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            self._data.append(value)
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")
        # id / retry / unknown fields: not used by any provider we speak to


DONE = b"data: [DONE]\n\n"


def frame(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def frame_event(event: str, data: bytes) -> bytes:
    return b"".join(event_parts(event, data))  # (one copy of a long data)


def event_parts(event: str, data: bytes) -> tuple[bytes, ...]:
    """An event's frame as the parts to join (several frames joined at once copy each data once)."""
    return b"event: ", event.encode(), b"\ndata: ", data, b"\n\n"

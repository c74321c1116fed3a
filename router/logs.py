"""Structured logs: JSON lines on stderr, written by a background thread.

``setup`` (called by ``create_app``) gives the ``router`` loggers their level and, when logging is
not configured yet (the root logger has no handler: ``router serve``) and ``[observability]
log_format`` is not ``none``, one handler that puts records on a queue; a background thread
formats (JSON or text) and writes them to stderr in batches every 50 ms, so a slow stderr never
stalls the event loop and no record costs a thread wake-up. An
application that mounts the gateway and configured logging itself keeps its own handlers (it may use
:class:`JsonFormatter`). The ``router.access`` logger gets one line per HTTP request (see
:func:`access`); keys never appear in it (only the key's id and its group's name; a key sent as the
model or in the path is redacted, and one sent as the x-request-id is not taken: core/redact.py).

    {"ts": "2026-11-22T10:00:00.123Z", "level": "INFO", "logger": "router.access", "msg": "request",
     "method": "POST", "path": "/v1/chat/completions", "status": 200, "latency_ms": 12.3,
     "request_id": "req_...", "model": "openai/gpt-4o-mini", "provider": "openai", "group": "acme",
     "key_id": 7, "stream": false, "client": "10.0.0.5"}
"""

from __future__ import annotations

import atexit
import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass
from logging.handlers import QueueHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import msgspec

from core.redact import DEFAULT_KEY_PREFIX, redact_keys

if TYPE_CHECKING:
    from billing.store import Principal
    from core.config import ObservabilitySettings
    from core.types import Scope
    from gateway.context import CallContext

ACCESS = logging.getLogger("router.access")
TRACE = "trace"  # the scope["state"] key of a request's Trace


@dataclass(slots=True)
class Trace:
    """What one request's access-log line says beyond HTTP, filled in while it is served: its id
    (``router.middleware.Front``), the caller once authenticated, the model asked for and the provider
    and deployment that serve it (the endpoints); for a model call, its context (a call refused before
    anything was reserved is recorded from it: ``router.chat.record_refusal``). A key sent as the model
    is redacted as it is noted (core/redact.py): neither the access log nor a refusal's record gets it."""

    request_id: str
    began: float = 0.0  # time.perf_counter() when the request arrived
    caller: Principal | None = None
    _model: str | None = None  # (see model)
    provider: str | None = None
    deployment: str | None = None  # the provider's deployment that served (core/deployments.py)

    def served(self, provider: str, deployment: str) -> None:
        """The provider and deployment that answered the call."""
        self.provider, self.deployment = provider, deployment

    context: CallContext | None = None  # a model call's context, once its caller is known
    stream: bool = False  # the call asked for a stream
    # the request's body was read to its end (router.chat.read_body says so; Front watches other routes' reads)
    body_read: bool = False
    key_prefix: str = DEFAULT_KEY_PREFIX  # the form of this gateway's keys ([server] key_prefix)

    @property
    def model(self) -> str | None:
        """The model the request asks for, as it asks (a key in it redacted)."""
        return self._model

    @model.setter
    def model(self, value: str | None) -> None:
        self._model = redact_keys(value, self.key_prefix) if isinstance(value, str) else value


def trace_of(scope: Scope) -> Trace:
    """The request's Trace (a blank one when no ``Front`` made it: an app called some other way)."""
    trace = (scope.get("state") or {}).get(TRACE)
    return trace if isinstance(trace, Trace) else Trace("")


class _AccessLine(msgspec.Struct):
    """The JSON access line (a struct encodes several times faster than the same dict)."""

    ts: str
    level: str
    logger: str
    msg: str
    method: str | None
    path: str | None
    status: int
    latency_ms: float
    request_id: str | None
    model: str | None
    provider: str | None
    deployment: str | None
    group: str | None
    key_id: int | None
    stream: bool
    client: str | None


ACCESS_FIELDS = _AccessLine.__struct_fields__[
    4:
]  # the fields of an access line, after ts, level, logger, msg


def access_fields(values: tuple[Any, ...]) -> dict[str, Any]:
    """The values of an access line (as :func:`access` collects them) by field name."""
    return dict(zip(ACCESS_FIELDS, values, strict=True))


_encode = msgspec.json.Encoder(enc_hook=str).encode
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "fields"}
# how many attributes a record has when nobody added any
_PLAIN = len(logging.LogRecord("", 0, "", 0, "", None, None).__dict__)


_second: list[Any] = [-1, ""]  # the last whole second formatted, and its text


def _timestamp(created: float) -> str:
    seconds = int(created)
    if seconds != _second[0]:
        _second[:] = [seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))]
    return f"{_second[1]}.{int((created - seconds) * 1000):03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    attributes = record.__dict__
    fields = attributes.get("fields")
    if isinstance(fields, dict) and len(attributes) == _PLAIN + 1:
        return fields  # an access-log record: nothing else to look for
    out = dict(fields) if isinstance(fields, dict) else {}
    for name, value in attributes.items():  # `extra=` given the ordinary way
        if name not in _STANDARD:
            out[name] = value
    return out


class _LineFormatter(logging.Formatter):
    """A record (or an access line put on the queue by :func:`access`) as one line: :meth:`line`."""

    def format(self, record: logging.LogRecord) -> str:
        exc = self.formatException(record.exc_info) if record.exc_info else None
        return self.line(
            record.created, record.levelname, record.name, record.getMessage(), _fields(record), exc
        )

    def format_access(self, created: float, values: tuple[Any, ...]) -> str:
        """An access line from :func:`access`: its time and the values of ``ACCESS_FIELDS``."""
        return self.line(created, "INFO", ACCESS.name, "request", access_fields(values))

    def line(
        self,
        created: float,
        level: str,
        logger: str,
        msg: str,
        fields: dict[str, Any],
        exc: str | None = None,
    ) -> str:
        raise NotImplementedError


class JsonFormatter(_LineFormatter):
    """One JSON object per record: ts, level, logger, msg, then the record's fields."""

    def format_access(self, created: float, values: tuple[Any, ...]) -> str:
        return _encode(_AccessLine(_timestamp(created), "INFO", ACCESS.name, "request", *values)).decode()

    def line(
        self,
        created: float,
        level: str,
        logger: str,
        msg: str,
        fields: dict[str, Any],
        exc: str | None = None,
    ) -> str:
        out: dict[str, Any] = {"ts": _timestamp(created), "level": level, "logger": logger, "msg": msg}
        out.update(fields)
        if exc:
            out["exc"] = exc
        return _encode(out).decode()


class TextFormatter(_LineFormatter):
    def line(
        self,
        created: float,
        level: str,
        logger: str,
        msg: str,
        fields: dict[str, Any],
        exc: str | None = None,
    ) -> str:
        head = f"{_timestamp(created)} {level} {logger}: {msg}"
        rest = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        text = f"{head} {rest}" if rest else head
        if exc:
            text += "\n" + exc
        return text


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when the record is written."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class _Enqueue(QueueHandler):
    """Hands the record over as it is: formatting happens on the listener's thread."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


class _Batches(threading.Thread):
    """Formats and writes queued records every ``interval`` seconds, all at once: the event loop only
    appends to a queue (no wake-up of this thread, no hand-over of the GIL per record). Access lines go
    to ``access_out`` when there is one (``[observability] access_log_file``), else with the rest."""

    def __init__(
        self,
        q: queue.SimpleQueue[Any],
        target: logging.Handler,
        interval: float = 0.05,
        access_out: TextIO | None = None,
    ) -> None:
        super().__init__(name="router-logs", daemon=True)
        self.q, self.target, self.interval, self.access_out = q, target, interval, access_out
        formatter = target.formatter
        assert isinstance(formatter, _LineFormatter)  # setup() gives the target one of ours
        self.formatter = formatter  # it formats the access lines access() queues as tuples
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.flush()
        self.flush()

    def flush(self) -> None:
        lines: list[str] = []
        accesses = lines if self.access_out is None else []
        while True:
            try:
                record = self.q.get_nowait()
            except queue.Empty:
                break
            try:
                if isinstance(record, tuple):  # an access line put here by access(): (created, values)
                    accesses.append(self.formatter.format_access(*record))
                elif record.name == ACCESS.name:
                    accesses.append(self.target.format(record))
                else:
                    lines.append(self.target.format(record))
            except Exception:  # noqa: BLE001 - a bad record must not stop the logs
                lines.append(f"unformattable log record: {getattr(record, 'msg', record)!r}")
        _write(sys.stderr, lines)
        if self.access_out is not None:
            _write(self.access_out, accesses)

    def stop(self) -> None:
        self.stopping.set()
        self.join(2)


def _write(out: TextIO, lines: list[str]) -> None:
    if lines:
        try:
            out.write("\n".join(lines) + "\n")
            out.flush()
        except (OSError, ValueError):
            pass


_handler: _Enqueue | None = None
_listener: _Batches | None = None
_queue: queue.SimpleQueue[Any] | None = None
_ROUTER = logging.getLogger("router")


def setup(settings: ObservabilitySettings) -> None:
    """Level and (once per process, if logging is unconfigured) the handler of the ``router`` loggers."""
    global _handler, _listener, _queue
    logger = logging.getLogger("router")
    logger.setLevel(settings.log_level.upper())
    if settings.log_format == "none" or _handler is not None or logging.getLogger().handlers:
        return
    target = _Stderr()
    target.setFormatter(JsonFormatter() if settings.log_format == "json" else TextFormatter())
    access_out = None
    if settings.access_log_file:
        path = Path(settings.access_log_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        access_out = path.open("a", encoding="utf-8")  # for the process's life
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    _listener = _Batches(q, target, access_out=access_out)
    _listener.start()
    atexit.register(_listener.stop)
    _handler = _Enqueue(q)
    _queue = q
    logger.addHandler(_handler)
    logger.propagate = False


def access(scope: Scope, status: int, seconds: float, stream: bool) -> None:
    """The access-log line of one request, with what the endpoint noted in its :class:`Trace`."""
    trace = trace_of(scope)
    caller = trace.caller
    client = scope.get("client")
    path = scope.get("path")
    values = (  # ACCESS_FIELDS
        scope.get("method"),
        redact_keys(path, trace.key_prefix) if isinstance(path, str) else path,  # (GET /v1/models/<a key>)
        status,
        round(seconds * 1000, 3),
        trace.request_id or None,
        trace.model,
        trace.provider,
        trace.deployment,
        caller.group_name if caller is not None else None,
        caller.key_id if caller is not None else None,
        stream,
        client[0] if client else None,
    )
    if (
        _queue is not None
        and not ACCESS.handlers
        and not ACCESS.filters
        and ACCESS.propagate
        and _ROUTER.handlers == [_handler]
    ):
        _queue.put((time.time(), values))  # only our own writer listens: it formats the line (no LogRecord)
        return
    record = logging.LogRecord(ACCESS.name, logging.INFO, "", 0, "request", None, None)
    record.fields = access_fields(values)
    ACCESS.handle(record)

"""The probes of ``bench/timeline.py``, run as a server's wrapper, as callgrind is:

    python bench/probe.py PYTHON SCRIPT ARGS...

runs SCRIPT with ARGS as ``__main__`` in this interpreter (PYTHON, the one the unwrapped command named,
is this one) and times each HTTP request's milestones, as nanoseconds from the moment hypercorn hands
the request to the ASGI app: the response's start, its last body message handed to the server and
back, the upstream request (aiohttp's ``ClientSession._request``: called → the upstream's headers in),
and the entry and exit of each step named in ``$BENCH_PROBE_STEPS`` (``module:Class:function`` or
``module::function``, comma-separated; the first time in a request). A function is replaced in the
module named, so name the one that calls it (``gateway.pipeline::open_upstream``, which
gateway.pipeline imports from gateway.reliability). ``SIGUSR1`` forgets what was timed, ``SIGUSR2``
writes each milestone's median and 99th percentile to ``$BENCH_PROBE_DIR/probe-<pid>.json``.

Before the script runs, aiohttp, hypercorn and the steps' modules are imported (the server imports
them anyway). A probe costs a microsecond or two, so later milestones run a little late.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import json
import os
import runpy
import signal
import sys
import time
from typing import Any

_now = time.perf_counter_ns
_request: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
    "probe_request", default=None
)
_done: list[dict[str, int]] = []


def _mark(name: str) -> None:
    marks = _request.get()
    if marks is not None and name not in marks:
        marks[name] = _now()


def _timed(function: Any, label: str) -> Any:
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            _mark(f"{label} >")
            try:
                return await function(*args, **kwargs)
            finally:
                _mark(f"{label} <")

        return timed_async

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        _mark(f"{label} >")
        try:
            return function(*args, **kwargs)
        finally:
            _mark(f"{label} <")

    return timed


def _install_server() -> None:
    import aiohttp.client
    import hypercorn.app_wrappers

    session = aiohttp.client.ClientSession
    session._request = _timed(session._request, "upstream request")  # type: ignore[method-assign]
    wrapper = hypercorn.app_wrappers.ASGIWrapper
    inner = wrapper.__call__

    async def call(self: Any, scope: dict[str, Any], receive: Any, send: Any, *more: Any) -> None:
        if scope.get("type") != "http":
            return await inner(self, scope, receive, send, *more)
        marks = {"app called": _now()}
        token = _request.set(marks)

        async def timed_send(message: dict[str, Any]) -> None:
            kind = message.get("type")
            last = kind == "http.response.body" and not message.get("more_body")
            if kind == "http.response.start":
                marks.setdefault("response start", _now())
            elif last:
                marks["response last body >"] = _now()
            await send(message)
            if last:
                marks["response last body <"] = _now()

        try:
            return await inner(self, scope, receive, timed_send, *more)
        finally:
            marks["app returned"] = _now()
            _request.reset(token)
            _done.append(marks)

    wrapper.__call__ = call  # type: ignore[method-assign]


def _install_steps(steps: str) -> None:
    for step in filter(None, steps.split(",")):
        module_name, owner_name, name = step.split(":")
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        setattr(
            owner,
            name,
            _timed(getattr(owner, name), f"{owner_name or module_name.rsplit('.', 1)[-1]}.{name}"),
        )


def medians() -> dict[str, Any]:
    """Each milestone's median and 99th percentile offset from the request's start (µs), and in how
    many requests it came."""
    offsets: dict[str, list[float]] = {}
    for marks in _done:
        began = marks["app called"]
        for name, at in marks.items():
            offsets.setdefault(name, []).append((at - began) / 1000)
    out = {}
    for name, values in offsets.items():
        values.sort()
        out[name] = {
            "us": round(values[len(values) // 2], 1),
            "p99_us": round(values[len(values) * 99 // 100], 1),
            "n": len(values),
        }
    return {"requests": len(_done), "milestones": out}


def _forget(*_: Any) -> None:
    _done.clear()


def _write(*_: Any) -> None:
    path = os.path.join(os.environ.get("BENCH_PROBE_DIR", "."), f"probe-{os.getpid()}.json")
    with open(path + ".tmp", "w") as out:
        json.dump(medians(), out)
    os.replace(path + ".tmp", path)


def main() -> None:
    script, args = sys.argv[2], sys.argv[3:]
    _install_server()
    _install_steps(os.environ.get("BENCH_PROBE_STEPS", ""))
    signal.signal(signal.SIGUSR1, _forget)
    signal.signal(signal.SIGUSR2, _write)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(
        os.path.abspath(script)
    )  # (as if the script ran itself, not bench/'s modules)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

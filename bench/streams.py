"""5,000 concurrent slow streams through one gateway process: memory per stream and starvation.

    .venv/bin/python -m bench.streams [--streams 5000] [--tokens 40] [--delay-ms 250]

The emulators and the gateway run as their own processes (as in ``make bench``); a client process
(aiohttp, uvloop) opens N streams at once, each answering ``--tokens`` tokens ``--delay-ms`` apart, and
records, per stream, the largest gap between two chunks it received. The gateway's RSS is read with
all streams open (after every stream got its first chunk) and compared with its RSS before: the
difference over N is the memory each open stream costs. Once all are open, a stream "starved" if one
of its gaps between chunks is over three times the upstream's own pacing (the opening storm itself,
N connections at once on 2 cores, is reported separately).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.procs import stop_all
from bench.stack import start_bare, start_emulators, start_gateway, wait_ready

RESULTS = Path(__file__).with_name("results")
BUDGET_KB = 40  # memory per open stream
BUDGET_GAP = 1.5  # the largest gap between two chunks, steady state, over the upstream's pacing
BUDGET_OPEN_S = 10.0  # every stream has had its first chunk


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Tally:
    """What the client saw, stream by stream, whichever protocol carried them."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.first = asyncio.Event()  # every stream opened or refused
        self.got_first = 0
        self.arrivals: list[list[float]] = []  # per completed stream: when each of its chunks arrived
        self.done_ok = 0
        self.errors: dict[str, int] = {}
        self.refused = 0  # streams answered with an error status instead of a stream
        self.opened_at = float("inf")  # every stream has had its first chunk
        self.closing_at = float("inf")  # the first stream has ended

    def _accounted(self, at: float) -> None:
        """One more stream opened or refused: once every one is, all that will open are open."""
        if self.got_first + self.refused == self.n:
            self.opened_at = at
            self.first.set()

    def error(self, name: str) -> None:
        self.errors[name] = self.errors.get(name, 0) + 1

    def refuse(self, status: int) -> None:
        self.error(f"http_{status}")
        self.refused += 1
        self._accounted(time.monotonic())  # (when the last is refused, the rest are open: measure them)

    def chunk(self, times: list[float]) -> None:
        times.append(time.monotonic())
        if len(times) == 1:
            self.got_first += 1
            self._accounted(times[0])

    def ended(self, times: list[float]) -> None:
        if times:
            self.closing_at = min(self.closing_at, times[-1])
        self.arrivals.append(times)
        self.done_ok += 1


async def over_http1(url: str, headers: dict[str, str], body: bytes, tally: Tally) -> list[asyncio.Task]:
    """One connection per stream (aiohttp): the gateway holds two descriptors a stream."""
    import aiohttp

    async def one(session: aiohttp.ClientSession) -> None:
        times: list[float] = []
        try:
            async with session.post(url, data=body, headers=headers) as r:
                if r.status != 200:
                    return tally.refuse(r.status)
                async for _ in r.content.iter_any():
                    tally.chunk(times)
            tally.ended(times)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            tally.error(type(exc).__name__)

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600)
    )
    tasks = [asyncio.create_task(one(session)) for _ in range(tally.n)]
    tasks.append(asyncio.create_task(_close_after(list(tasks), session.close)))
    return tasks


async def _close_after(tasks: list[asyncio.Task], close: Any) -> None:
    await asyncio.gather(*tasks)
    await close()


async def over_http2(
    url: str, headers: dict[str, str], body: bytes, tally: Tally, per_connection: int
) -> list[asyncio.Task]:
    """HTTP/2 with prior knowledge (h2c), ``per_connection`` streams a connection (hypercorn allows 100):
    the gateway holds one descriptor a stream (its upstream), so 10,000 streams fit a 20,000 limit."""
    import h2.config
    import h2.connection
    import h2.events

    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    path = "/" + url.split("//")[1].split("/", 1)[1]
    request = [
        (b":method", b"POST"),
        (b":path", path.encode()),
        (b":scheme", b"http"),
        (b":authority", f"{host}:{port}".encode()),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in headers.items()),
    ]

    async def connection(count: int) -> None:
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
        except OSError as exc:
            for _ in range(count):
                tally.error(type(exc).__name__)
            return
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        conn.initiate_connection()
        conn.increment_flow_control_window(2**30)
        streams: dict[int, list[float]] = {}
        for _ in range(count):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, request)
            conn.send_data(sid, body, end_stream=True)
            streams[sid] = []
        writer.write(conn.data_to_send())
        try:
            while streams:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionResetError("the gateway closed the connection")
                for ev in conn.receive_data(data):
                    if isinstance(ev, h2.events.ResponseReceived):
                        status = int(dict(ev.headers)[b":status"])
                        if status != 200:
                            streams.pop(ev.stream_id)
                            tally.refuse(status)
                    elif isinstance(ev, h2.events.DataReceived):
                        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                        if ev.stream_id in streams and ev.data:
                            tally.chunk(streams[ev.stream_id])
                    elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id in streams:
                        tally.ended(streams.pop(ev.stream_id))
                    elif isinstance(ev, h2.events.StreamReset) and ev.stream_id in streams:
                        streams.pop(ev.stream_id)
                        tally.error("StreamReset")
                writer.write(conn.data_to_send())
        except Exception as exc:  # noqa: BLE001 - counted and reported
            for _ in streams:
                tally.error(type(exc).__name__)
        writer.close()

    sizes = [min(per_connection, tally.n - i) for i in range(0, tally.n, per_connection)]
    return [asyncio.create_task(connection(size)) for size in sizes]


async def count_window(pid: int, out: Path, seconds: float) -> tuple[float, float, int]:
    """Callgrind's count of process ``pid`` over the next ``seconds``: (start, end, instructions)."""
    from bench.instructions import control, dumped_total

    await asyncio.to_thread(control, "-z", str(pid))
    start = time.monotonic()
    await asyncio.sleep(seconds)
    end, wall = time.monotonic(), time.time()
    await asyncio.to_thread(control, "-d", str(pid))
    return start, end, dumped_total(out, pid, wall - 1)


async def client(
    url: str,
    key: str,
    model: str,
    n: int,
    tokens: int,
    delay_ms: int,
    gateway_pid: int,
    http2: int = 0,
    counted: Path | None = None,
    pacings: int = 4,
) -> dict:
    body = json.dumps(
        {
            "model": model,
            "stream": True,
            "messages": [{"role": "user", "content": f"hold [tokens:{tokens}] [delay:{delay_ms}]"}],
        }
    ).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    tally = Tally(n)
    before = rss_kb(gateway_pid)
    began = time.monotonic()
    if http2:
        tasks = await over_http2(url, headers, body, tally, http2)
    else:
        tasks = await over_http1(url, headers, body, tally)
    try:
        await asyncio.wait_for(tally.first.wait(), timeout=120)
        all_open_after = time.monotonic() - began
    except TimeoutError:
        all_open_after = None
    during = rss_kb(gateway_pid)
    window = (
        await count_window(gateway_pid, counted, pacings * delay_ms / 1000) if counted is not None else None
    )
    # again near the streams' end: what each has kept of what it relayed (text kept to estimate an
    # interrupted stream's usage, buffers) shows here
    await asyncio.sleep(max(0.0, (tokens - 4) * delay_ms / 1000 - (time.monotonic() - began)))
    late = rss_kb(gateway_pid)
    await asyncio.gather(*tasks)
    # a stream's gaps by phase: opening (not every stream open yet), steady (all open, none ended: the
    # budget), closing (streams ending together: every call's settlement and access line at once). A
    # stream's own end is closing too: the gateway sends the finish chunk, the usage chunk and [DONE]
    # together once the upstream's usage has come (the emulator paces even those a --delay-ms apart)
    gaps, ramp_gaps, closing_gaps = [], [], []
    for times in tally.arrivals:
        worst = {"opening": 0.0, "steady": 0.0, "closing": 0.0}
        for i, (last, now) in enumerate(zip(times, times[1:], strict=False)):
            ending = i == len(times) - 2 or now > tally.closing_at
            phase = "opening" if last < tally.opened_at else "closing" if ending else "steady"
            worst[phase] = max(worst[phase], now - last)
        gaps.append(worst["steady"])
        ramp_gaps.append(worst["opening"])
        closing_gaps.append(worst["closing"])
    opened = n - tally.refused
    counts: dict[str, Any] = {}
    if window is not None:  # the chunks relayed while callgrind counted, and what each cost the server
        start, end, instructions = window
        chunks = sum(1 for times in tally.arrivals for t in times if start <= t <= end)
        counts = {
            "counted_s": round(end - start, 3),
            "chunks_counted": chunks,
            "instructions": instructions,
            "instructions_per_chunk": round(instructions / chunks) if chunks else None,
        }
    return {
        **counts,
        "streams": n,
        "completed": tally.done_ok,
        "errors": tally.errors,
        "protocol": f"HTTP/2, {http2} streams a connection" if http2 else "HTTP/1.1, a connection a stream",
        "all_open_after_s": all_open_after,
        "gateway_rss_before_kb": before,
        "gateway_rss_with_all_open_kb": during,
        "open": opened,
        "kb_per_stream": round((during - before) / opened, 1) if opened else None,
        "gateway_rss_near_the_end_kb": late,
        "kb_per_stream_near_the_end": round((late - before) / opened, 1) if opened else None,
        "max_gap_s": round(max(gaps), 3) if gaps else None,
        "p99_gap_s": round(statistics.quantiles(gaps, n=100)[98], 3) if len(gaps) >= 100 else None,
        "max_gap_while_opening_s": round(max(ramp_gaps), 3) if ramp_gaps else None,
        "max_gap_while_closing_s": round(max(closing_gaps), 3) if closing_gaps else None,
        "upstream_pacing_s": delay_ms / 1000,
    }


def raise_descriptor_limit(streams: int) -> None:
    """Each open stream holds two descriptors in the gateway (its client and its upstream) and one in
    the client and the emulator: ask for enough (children inherit it), as a deployment sets
    ``LimitNOFILE``; the gateway caps its connections by what its limit allows (``max_connections``)."""
    import resource

    need = 2 * streams + 2048
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        try:
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (need, max(need, hard) if hard != resource.RLIM_INFINITY else hard)
            )
        except (ValueError, OSError) as exc:
            print(
                f"descriptor limit {soft}/{hard} stays ({exc}): the gateway takes at most about half of it in "
                "streams",
                file=sys.stderr,
            )


def run_streams(args: argparse.Namespace, name: str, counted: bool = False) -> dict[str, Any]:
    """The emulators, server ``name`` (under callgrind if ``counted``) and the client's streams."""
    from bench.instructions import callgrind

    procs = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = (Path(args.keep) if args.keep else Path(tmp) / "callgrind") / name
            out.parent.mkdir(parents=True, exist_ok=True)
            wrap = callgrind(out) if counted else None
            emu, emulators = start_emulators(RESULTS)
            procs.append(emu)
            if name.startswith("bare"):
                server = {"bare-uvicorn": "uvicorn", "bare-tuned": "hypercorn-tuned"}.get(name, "hypercorn")
                gw = start_bare(RESULTS, *emulators["openai"], server, wrap=wrap)
            else:
                store = (
                    ()
                    if args.checkpoint_seconds is None
                    else (f"checkpoint_seconds = {args.checkpoint_seconds:g}",)
                )
                gw = start_gateway(RESULTS, Path(tmp), emulators, name, wrap=wrap, store=store)
            procs.append(gw.proc)
            wait_ready(gw, 180 if counted else 30)
            run: Any
            try:
                import uvloop

                run = uvloop.run
            except ImportError:
                run = asyncio.run
            pid = gw.proc.popen.pid if counted else gw.proc.pid
            return run(
                client(
                    gw.url,
                    gw.key,
                    gw.model,
                    args.streams,
                    args.tokens,
                    args.delay_ms,
                    pid,  # type: ignore[no-any-return]
                    args.http2,
                    out if counted else None,
                    args.window,
                )
            )
    finally:
        stop_all(procs)


def main(argv: list[str] | None = None, exit_after: bool = True) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.streams",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--streams", type=int, default=5000)
    p.add_argument("--tokens", type=int, default=90)
    p.add_argument("--delay-ms", type=int, default=1000)
    p.add_argument(
        "--http2",
        type=int,
        default=0,
        metavar="N",
        help="the client speaks HTTP/2 (h2c, prior knowledge), N streams a connection (hypercorn "
        "allows 100): the gateway then holds one descriptor a stream instead of two",
    )
    p.add_argument(
        "--server",
        choices=("gateway", "bare", "bare-tuned", "gw-uvicorn", "bare-uvicorn"),
        default="gateway",
        help="bare: the bare hypercorn proxy instead, the floor of the stack; bare-tuned: the same on "
        "the gateway's server layer; the -uvicorn ones the same under uvicorn",
    )
    p.add_argument(
        "--instructions",
        action="store_true",
        help="count with callgrind what a relayed chunk costs the server, once all streams are open "
        "(4 pacings of it), for --server and for the bare proxy, and their ratio (the server runs "
        "about 50 times slower: use a few hundred streams)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=4,
        metavar="N",
        help="with --instructions: count over N pacings (a multiple of the checkpoint interval, in "
        "seconds, takes in the same number of checkpoints per stream whatever the phase)",
    )
    p.add_argument(
        "--checkpoint-seconds",
        type=float,
        metavar="S",
        help="the gateway's [store] checkpoint_seconds (default: its default; 0: no checkpoints)",
    )
    p.add_argument(
        "--keep",
        metavar="DIR",
        help="with --instructions: keep callgrind's dumps in DIR (for callgrind_annotate)",
    )
    args = p.parse_args(argv)
    RESULTS.mkdir(exist_ok=True)
    raise_descriptor_limit(args.streams)
    if args.instructions:
        per_chunk: dict[str, int] = {}
        for server in ("bare", args.server):
            counted = run_streams(args, server, counted=True)
            per_chunk[server] = int(counted.get("instructions_per_chunk") or 0)
            print(
                f"{server}: {counted.get('instructions_per_chunk')} instructions per relayed chunk "
                f"({counted.get('chunks_counted')} chunks in {counted.get('counted_s')} s, {counted['completed']}/"
                f"{counted['streams']} streams completed)",
                flush=True,
            )
        if per_chunk["bare"] and per_chunk[args.server]:
            print(f"{args.server} / bare: {per_chunk[args.server] / per_chunk['bare']:.2f}x per chunk")
        (RESULTS / "streams-instructions.json").write_text(json.dumps(per_chunk, indent=2))
        if exit_after:
            sys.exit(0)
        return
    result = run_streams(args, args.server)
    result["budget"] = {
        "kb_per_stream": BUDGET_KB,
        "max_gap_over_pacing": BUDGET_GAP,
        "all_open_s": BUDGET_OPEN_S,
    }
    starved = result["max_gap_s"] is None or result["max_gap_s"] > BUDGET_GAP * args.delay_ms / 1000
    slow = result["all_open_after_s"] is None or result["all_open_after_s"] > BUDGET_OPEN_S
    result["starved"] = starved
    result["pass"] = bool(
        result["kb_per_stream"] is not None
        and result["kb_per_stream"] <= BUDGET_KB
        and result["completed"] == args.streams
        and not starved
        and not slow
    )
    (RESULTS / "streams.json").write_text(json.dumps(result, indent=2))
    print(f"{result['completed']}/{result['streams']} streams completed, errors {result['errors']}")
    print(
        f"all {args.streams} streams had their first chunk after {result['all_open_after_s']} s "
        f"(budget {BUDGET_OPEN_S:g} s)"
    )
    print(
        f"gateway RSS {result['gateway_rss_before_kb']} KB before, {result['gateway_rss_with_all_open_kb']} KB "
        f"with all open: {result['kb_per_stream']} KB per open stream (budget {BUDGET_KB} KB); "
        f"{result['kb_per_stream_near_the_end']} KB near their end, {args.tokens} tokens relayed"
    )
    print(
        f"with all streams open, the largest gap between two chunks of one stream: {result['max_gap_s']} s "
        f"(p99 {result['p99_gap_s']} s; the upstream paces at {result['upstream_pacing_s']} s, budget "
        f"{BUDGET_GAP}x; {result['max_gap_while_opening_s']} s while streams were still opening, "
        f"{result['max_gap_while_closing_s']} s while they ended)"
    )
    print("PASS" if result["pass"] else "FAIL", flush=True)
    if exit_after:
        sys.exit(0)


if __name__ == "__main__":
    main()

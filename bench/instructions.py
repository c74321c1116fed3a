"""Instructions per call, counted by callgrind: the gateway against the bare proxy, without noise.

    .venv/bin/python -m bench.instructions [--calls 400] [--concurrency 8] [--repeat 3] [--responses | --messages | --codex]

req/s on a shared 2-CPU machine moves by 10-30 % from run to run, and so do the throughput ratios of
``make bench``. An instruction count does not: ``valgrind --tool=callgrind`` counts what the server
process executes (every thread: event loop, store, log writer), the same to about 1 % from run to
run whatever else the machine does. Each server runs under callgrind; after a warm-up the counters
are zeroed, ``--calls`` calls are made (``--concurrency`` at a time, the same 12-token request as
``make bench``), and the counters dumped: their total over the calls is the cost of one call.

The servers: the bare proxy (the floor of the stack: stock hypercorn), the same proxy on the gateway's
own server layer (``bare-tuned``: what ``router serve`` installs under hypercorn, which is part of what
the gateway saves), the gateway with every feature on (as in ``make bench``), the gateway with the ``x-ratelimit-*`` headers on 429s only (``[limits] headers = false``),
without rate limits, and without rate limits and access log (what those cost), with limits of calls in
flight per key and group (off by default: what they add, on SQLite and on PostgreSQL + Redis), and the
gateway and the bare proxy under uvicorn. Instructions are not time (a syscall or a cache miss costs more than its count), so this
complements the wall-clock figures: ``gateway / bare`` here is how much more work a call is.
Needs valgrind (Debian's package); about 5 minutes. Results: bench/results/instructions.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench import benchvenv
from bench.load import body_bytes
from bench.procs import stop_all
from bench.stack import (
    REDIS_URL,
    ROOT,
    Target,
    drop_pg_database,
    pg_database,
    start_bare,
    start_emulators,
    start_gateway,
    start_litellm,
    wait_ready,
)

RESULTS = Path(__file__).with_name("results")


class Mode(NamedTuple):
    name: str
    stream: bool
    responses: bool = False  # POST /v1/responses instead of chat
    store: bool = False  # with store: true (the gateway keeps the response), else store: false
    messages: bool = False  # POST /v1/messages (Anthropic's API) instead of chat
    model: str | None = None  # another model than the target's
    codex: bool = (
        False  # the Responses call as Codex makes it (30 tools, store false, ...: codex_body); a chat
    )
    # or Messages call with the same tools and prompt (chat_tools_body, messages_body)


MODES = (Mode("non-stream", False), Mode("stream", True))
MODE_NAMES = [mode.name for mode in MODES]
# --responses: the Responses endpoint, each call unstored and stored (what keeping a response costs)
RESPONSES = (
    Mode("resp", False, True),
    Mode("resp stored", False, True, True),
    Mode("resp stream", True, True),
    Mode("resp str stored", True, True, True),
)
# --messages: a call to Claude (passed through) and to Gemini (translated) on /v1/messages against the
# same call on /v1/chat/completions
CLAUDE, GEMINI, OPENAI = "anthropic/claude-haiku-4-5", "google/gemini-2.5-flash", "openai/gpt-4o-mini"
MESSAGES = (
    Mode("chat claude", False, model=CLAUDE),
    Mode("msg claude", False, messages=True, model=CLAUDE),
    Mode("chat claude str", True, model=CLAUDE),
    Mode("msg claude str", True, messages=True, model=CLAUDE),
    Mode("chat gemini", False, model=GEMINI),
    Mode("msg gemini", False, messages=True, model=GEMINI),
    Mode("chat gemini str", True, model=GEMINI),
    Mode("msg gemini str", True, messages=True, model=GEMINI),
    # as Claude Code calls, with tools (Codex's 30, as Anthropic tools), against the chat call with them
    Mode("chat gemini tools", False, model=GEMINI, codex=True),
    Mode("msg gemini tools", False, messages=True, model=GEMINI, codex=True),
    Mode("chat gemini tools str", True, model=GEMINI, codex=True),
    Mode("msg gemini tools str", True, messages=True, model=GEMINI, codex=True),
)


class Server(NamedTuple):
    label: str
    floor: str  # the bare proxy it is compared with
    features: (
        tuple[bool, bool, bool] | None
    )  # the gateway's (rate limits, their headers, access log); None: bare
    server: str = "hypercorn"
    shared: bool = False  # the scale-out path: PostgreSQL store, rate limits and routing state in Redis
    in_flight: bool = False  # with limits of calls in flight per key and group (gateway/concurrency.py)
    store: tuple[str, ...] = ()  # more lines of its [store] section


SERVERS = {
    "bare": Server("bare proxy", "bare", None),
    "gateway": Server("gateway, every feature", "bare", (True, True, True)),
    "gw-no-limit-headers": Server("gateway, x-ratelimit-* on 429s only", "bare", (True, False, True)),
    "gw-no-limits": Server("gateway, no rate limits", "bare", (False, False, True)),
    "gw-no-limits-log": Server("gateway, no rate limits, no access log", "bare", (False, False, False)),
    # the bare proxy on the gateway's server layer (what router serve installs under hypercorn): the
    # gateway's features against it, apart from what that layer saves against stock hypercorn
    "bare-tuned": Server("bare proxy, gateway's server layer", "bare", None, "hypercorn-tuned"),
    "bare-uvicorn": Server("bare proxy under uvicorn", "bare-uvicorn", None, "uvicorn"),
    "gw-uvicorn": Server(
        "gateway under uvicorn, every feature", "bare-uvicorn", (True, True, True), "uvicorn"
    ),
    # compared with the same gateway on SQLite: what the path replicas use costs a call's process
    "gw-postgres": Server("gateway on PostgreSQL + Redis", "gateway", (True, True, True), shared=True),
    # what the limits of calls in flight (off by default) add: against the same gateway without them
    "gw-in-flight": Server("gateway + calls-in-flight limits", "gateway", (True, True, True), in_flight=True),
    "gw-pg-in-flight": Server(
        "PostgreSQL + Redis + in-flight limits",
        "gw-postgres",
        (True, True, True),
        shared=True,
        in_flight=True,
    ),
    # what a reply waiting for its settlement to be durable costs (the default): against replies that don't
    "gw-reply-no-wait": Server(
        "gateway, replies not waiting for their charge",
        "gateway",
        (True, True, True),
        store=("reply_wait_seconds = 0",),
    ),
    "gw-pg-reply-no-wait": Server(
        "PostgreSQL + Redis, replies not waiting",
        "gw-postgres",
        (True, True, True),
        shared=True,
        store=("reply_wait_seconds = 0",),
    ),
    # not in the default set: LiteLLM starts for minutes under callgrind, and a call costs it ~25x ours
    "litellm": Server("LiteLLM proxy (from .bench-venv)", "bare", None, "litellm"),
}
DEFAULT = [name for name in SERVERS if name != "litellm"]  # gw-postgres needs PostgreSQL and Redis


def callgrind(out: Path) -> list[str]:
    return [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}.%p",
        "--dump-instr=no",
        "--compress-strings=no",
    ]


def control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], capture_output=True, check=True, timeout=120)


def dumped_total(out: Path, pid: int, after: float) -> int:
    """The instruction total of the newest dump of process ``pid`` written after ``after``."""
    files = [p for p in out.parent.glob(f"{out.name}.{pid}*") if p.stat().st_mtime >= after]
    if not files:
        raise RuntimeError(f"callgrind wrote no dump for pid {pid}")
    newest = max(files, key=lambda p: p.stat().st_mtime)
    for line in newest.read_text(errors="replace").splitlines():
        if line.startswith("totals:") or line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals line in {newest}")


def responses_body(model: str, stream: bool, store: bool) -> bytes:
    chat = json.loads(body_bytes(model, stream, 12))
    body = {"model": model, "input": chat["messages"][0]["content"], "stream": stream, "store": store}
    return json.dumps(body, separators=(",", ":")).encode()


# --codex: a Responses call on Claude (translated) as Codex makes it against a plain one, stream and not,
# and against the chat call that carries the same work (the same 30 tools as functions, the same prompt):
# what the Responses surface costs beyond the chat one for one and the same call
CODEX = (
    Mode("resp claude", False, True, model=CLAUDE),
    Mode("codex claude", False, True, model=CLAUDE, codex=True),
    Mode("chat claude tools", False, model=CLAUDE, codex=True),
    Mode("resp claude str", True, True, model=CLAUDE),
    Mode("codex claude str", True, True, model=CLAUDE, codex=True),
    Mode("chat claude tools str", True, model=CLAUDE, codex=True),
    # and on OpenAI, which speaks the Responses API: the body passed through against the chat call
    Mode("codex openai", False, True, model=OPENAI, codex=True),
    Mode("chat openai tools", False, model=OPENAI, codex=True),
    Mode("codex openai str", True, True, model=OPENAI, codex=True),
    Mode("chat openai tools str", True, model=OPENAI, codex=True),
)


def codex_body(model: str, stream: bool) -> bytes:
    """What Codex sends each turn: 30 tools (28 functions, a namespace of two, the hosted web_search),
    store false, encrypted reasoning included, a reasoning summary, client_metadata, prompt_cache_key."""
    schema = {
        "type": "object",
        "properties": {
            "cmd": {"type": "string", "description": "The command."},
            "workdir": {"type": "string"},
        },
        "required": ["cmd"],
        "additionalProperties": False,
    }
    tools: list[Any] = [
        {
            "type": "function",
            "name": f"tool_{i}",
            "description": f"Tool number {i}.",
            "strict": False,
            "parameters": schema,
        }
        for i in range(27)
    ]
    tools.append(
        {
            "type": "namespace",
            "name": "agents",
            "description": "Sub-agents.",
            "tools": [{"type": "function", "name": n, "parameters": schema} for n in ("spawn", "close")],
        }
    )
    tools.append({"type": "web_search", "external_web_access": False})
    chat = json.loads(body_bytes(model, stream, 12))
    body = {
        "model": model,
        "stream": stream,
        "store": False,
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "client_metadata": {"session_id": "thread-1"},
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are Codex."}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": chat["messages"][0]["content"]}],
            },
        ],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def chat_tools_body(model: str, stream: bool) -> bytes:
    """Codex's call (codex_body) as a chat call: its 30 tools as functions, its instructions and prompt."""
    codex = json.loads(codex_body(model, stream))
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t["parameters"],
            },
        }
        for tool in codex["tools"]
        for t in (tool["tools"] if tool["type"] == "namespace" else [tool])
        if t["type"] == "function"
    ]
    tools.append(
        {
            "type": "function",
            "function": {
                "name": "web_search",
                "description": "Search the web.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    )
    body = {
        "model": model,
        "stream": stream,
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "messages": [
            {"role": "developer", "content": "You are Codex."},
            {"role": "user", "content": codex["input"][1]["content"][0]["text"]},
        ],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def messages_body(model: str, stream: bool, tools: bool = False) -> bytes:
    """The bench's prompt on /v1/messages; with ``tools``, as chat_tools_body's call: its tools as Anthropic
    tools, its instructions as the system prompt."""
    chat = json.loads(body_bytes(model, stream, 12))
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": 4096,
        "messages": chat["messages"],
        "stream": stream,
    }
    if tools:
        twin = json.loads(chat_tools_body(model, stream))
        body["system"] = twin["messages"][0]["content"]
        body["messages"] = twin["messages"][1:]
        body["tools"] = [
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "input_schema": t["function"]["parameters"],
            }
            for t in twin["tools"]
        ]
        body["tool_choice"] = {"type": "auto"}
    return json.dumps(body, separators=(",", ":")).encode()


async def drive(target: Target, mode: Mode, calls: int, concurrency: int) -> None:
    import aiohttp

    stream = mode.stream
    url = target.url
    model = mode.model or target.model
    data = body_bytes(model, stream, 12)
    if mode.responses:
        url = url.replace("/chat/completions", "/responses")
        data = codex_body(model, stream) if mode.codex else responses_body(model, stream, mode.store)
    elif mode.codex:
        data = chat_tools_body(model, stream)
    if mode.messages:
        url = url.replace("/chat/completions", "/messages")
        data = messages_body(model, stream, mode.codex)
    end = b"response.completed" if mode.responses else b"message_stop" if mode.messages else b"data: [DONE]"
    headers = {"Authorization": f"Bearer {target.key}", "Content-Type": "application/json"}
    left = [calls]

    async def worker(session: aiohttp.ClientSession) -> None:
        while left[0] > 0:
            left[0] -= 1
            async with session.post(url, data=data, headers=headers) as response:
                body = await response.read()
                if response.status != 200 or (stream and end not in body):
                    raise RuntimeError(f"{target.name}: HTTP {response.status}: {body[:300]!r}")

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))


def measure(
    name: str,
    emulators: dict[str, tuple[str, str]],
    tmp: Path,
    calls: int,
    concurrency: int,
    modes: tuple[Mode, ...] = MODES,
    repeat: int = 1,
) -> dict[str, float]:
    """k instructions per call of server ``name``, per mode: the median of ``repeat`` windows of
    ``calls`` calls (the gateway's varies by a few percent between windows: how many settlements a
    SQLite group commit gathers, and its work by the clock, depend on timing)."""
    label, _, features, server, shared, in_flight, store = SERVERS[name]
    out = tmp / "callgrind" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = tmp / "logs"
    base, key = emulators["openai"]
    if server == "litellm":
        venv = benchvenv.ensure(ROOT, benchvenv.LITELLM_VERSION, RESULTS / "bench-venv-install.log")
        if venv.litellm_problem:
            raise RuntimeError(f"LiteLLM: {venv.litellm_problem}")
        target = start_litellm(logs, tmp, venv.litellm, base, key, wrap=callgrind(out))
        calls = max(calls // 6, 30)
    elif features is None:
        target = start_bare(logs, base, key, server, wrap=callgrind(out))
    else:
        limits, limit_headers, access_log = features
        store_url = pg_database(f"router_instr_{os.getpid()}") if shared else None
        target = start_gateway(
            logs,
            tmp,
            emulators,
            "gateway" if server == "hypercorn" else "gw-uvicorn",
            store_url,
            REDIS_URL if shared else None,
            limits=limits,
            limit_headers=limit_headers,
            access_log=access_log,
            wrap=callgrind(out),
            home=name,
            in_flight=in_flight,
            store=store,
        )
    try:
        wait_ready(target, 900 if server == "litellm" else 180)  # (python under valgrind starts in 10-30 s)
        pid = target.proc.popen.pid
        figures: dict[str, float] = {}
        for mode in modes:
            asyncio.run(drive(target, mode, max(calls // 4, 50), concurrency))  # warm-up
            windows = []
            for _ in range(repeat):
                control("-z", str(pid))
                began = time.time()
                asyncio.run(drive(target, mode, calls, concurrency))
                control("-d", str(pid))
                windows.append(dumped_total(out, pid, began) / calls / 1000)
            figures[mode.name] = statistics.median(windows)
            each = f"  (median of {', '.join(f'{w:,.0f}' for w in windows)})" if repeat > 1 else ""
            print(
                f"  {label:40s} {mode.name:10s} {figures[mode.name]:8,.0f}k instructions per call{each}",
                flush=True,
            )
        return figures
    finally:
        stop_all([target.proc])
        if shared:
            drop_pg_database(f"router_instr_{os.getpid()}")


def responses_report(results: dict[str, dict[str, float]]) -> str:
    lines = ["Responses calls (callgrind, thousands of instructions per call): store false / store true"]
    for name, figures in results.items():
        for plain, stored in (("resp", "resp stored"), ("resp stream", "resp str stored")):
            lines.append(
                f"  {SERVERS[name].label:40s} {plain:12s} {figures[plain]:9,.0f} {figures[stored]:9,.0f}  "
                f"stored / unstored {figures[stored] / figures[plain]:.3f}x"
            )
    return "\n".join(lines)


def codex_report(results: dict[str, dict[str, float]]) -> str:
    lines = [
        "Codex-shaped Responses calls (callgrind, thousands of instructions per call): a plain call and the same "
        "prompt as Codex sends it (30 tools, store false, ...), on Claude (translated) and OpenAI (passed through)"
    ]
    for name, figures in results.items():
        for plain, codex, chat in (
            ("resp claude", "codex claude", "chat claude tools"),
            ("resp claude str", "codex claude str", "chat claude tools str"),
        ):
            lines.append(
                f"  {SERVERS[name].label:40s} {codex:16s} plain {figures[plain]:9,.0f}  codex {figures[codex]:9,.0f}"
                f"  codex / plain {figures[codex] / figures[plain]:.3f}x  chat, same tools "
                f"{figures[chat]:9,.0f}  codex / chat {figures[codex] / figures[chat]:.3f}x"
            )
        for codex, chat in (
            ("codex openai", "chat openai tools"),
            ("codex openai str", "chat openai tools str"),
        ):
            lines.append(
                f"  {SERVERS[name].label:40s} {codex:16s} {'(passed through)':25s} codex {figures[codex]:9,.0f}"
                f"  chat, same tools {figures[chat]:9,.0f}  codex / chat {figures[codex] / figures[chat]:.3f}x"
            )
    return "\n".join(lines)


def messages_report(results: dict[str, dict[str, float]]) -> str:
    lines = [
        "Messages calls (callgrind, thousands of instructions per call): /v1/chat/completions and /v1/messages, "
        "the same model and prompt"
    ]
    for name, figures in results.items():
        for chat in (
            "chat claude",
            "chat claude str",
            "chat gemini",
            "chat gemini str",
            "chat gemini tools",
            "chat gemini tools str",
        ):
            msg = chat.replace("chat", "msg")
            lines.append(
                f"  {SERVERS[name].label:40s} {msg:16s} chat {figures[chat]:9,.0f}  messages {figures[msg]:9,.0f}"
                f"  messages / chat {figures[msg] / figures[chat]:.3f}x"
            )
    return "\n".join(lines)


def report(results: dict[str, dict[str, float]]) -> str:
    lines = [
        "Instructions per call (callgrind, thousands), and against its floor: the bare proxy on the same server "
        "(the gateway on SQLite for gw-postgres)",
        f"  {'server':40s} " + " ".join(f"{mode:>12s} {'x floor':>7s}" for mode in MODE_NAMES),
    ]
    for name, figures in results.items():
        floor = results.get(SERVERS[name].floor, {})
        cells = []
        for mode in MODE_NAMES:
            times = f"{figures[mode] / floor[mode]:.2f}" if floor.get(mode) else "-"
            cells.append(f"{figures[mode]:12,.0f} {times:>7s}")
        lines.append(f"  {SERVERS[name].label:40s} " + " ".join(cells))
    gateway, bare, litellm = results.get("gateway"), results.get("bare"), results.get("litellm")
    shared = results.get("gw-postgres")
    if gateway and shared:
        for mode in MODE_NAMES:
            lines.append(
                f"  {mode}: a call on PostgreSQL + Redis executes {shared[mode] / gateway[mode]:.2f}x the "
                "instructions of the same call on SQLite, in the gateway's process"
            )
    if gateway and litellm:
        for mode in MODE_NAMES:
            lines.append(
                f"  {mode}: a call through LiteLLM executes {litellm[mode] / gateway[mode]:.1f}x the gateway's instructions"
            )
    tuned = results.get("bare-tuned")
    if gateway and tuned:
        for mode in MODE_NAMES:
            lines.append(
                f"  {mode}: the gateway's features cost {gateway[mode] / tuned[mode]:.2f}x the bare proxy on the "
                f"same server layer, which saves {1 - tuned[mode] / bare[mode]:.0%} of stock hypercorn's call"
                if bare
                else f"  {mode}: gateway / bare proxy on its server layer {gateway[mode] / tuned[mode]:.2f}x"
            )
    if gateway and bare:
        for mode in MODE_NAMES:
            ratio = gateway[mode] / bare[mode]
            lines.append(
                f"  {mode}: a call through the gateway executes {ratio:.2f}x the bare proxy's instructions "
                f"(at equal speed per instruction: {1 / ratio:.0%} of its throughput)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=400, help="calls counted per server and mode")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--repeat", type=int, default=1, help="windows of --calls per server and mode; the median is kept"
    )
    parser.add_argument(
        "--servers", default=",".join(DEFAULT), help=f"comma-separated, of: {', '.join(SERVERS)}"
    )
    parser.add_argument(
        "--responses",
        action="store_true",
        help="gateways only: POST /v1/responses with store false and true, stream and not",
    )
    parser.add_argument(
        "--messages",
        action="store_true",
        help="gateways only: POST /v1/messages against /v1/chat/completions, Claude and Gemini",
    )
    parser.add_argument(
        "--codex",
        action="store_true",
        help="gateways only: a Responses call as Codex makes it, on Claude and OpenAI, against the chat call",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="keep the callgrind dumps in this directory (read them with callgrind_annotate)",
    )
    args = parser.parse_args(argv)
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        print("bench.instructions: needs valgrind (apt-get install valgrind); not run", flush=True)
        return 2
    names = [n for n in args.servers.split(",") if n]
    unknown = [n for n in names if n not in SERVERS]
    if unknown:
        parser.error(f"unknown servers: {', '.join(unknown)}")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "logs").mkdir()
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            (tmp / "callgrind").symlink_to(args.keep.resolve())
        emulator, emulators = start_emulators(tmp / "logs")
        try:
            for name in names:
                modes = (
                    RESPONSES
                    if args.responses
                    else MESSAGES
                    if args.messages
                    else CODEX
                    if args.codex
                    else MODES
                )
                results[name] = measure(
                    name, emulators, tmp, args.calls, args.concurrency, modes, args.repeat
                )
        finally:
            stop_all([emulator])
    text = (
        responses_report(results)
        if args.responses
        else messages_report(results)
        if args.messages
        else codex_report(results)
        if args.codex
        else report(results)
    )
    print(text, flush=True)
    RESULTS.mkdir(exist_ok=True)
    record: dict[str, Any] = {
        "calls": args.calls,
        "concurrency": args.concurrency,
        "repeat": args.repeat,
        "k_instructions_per_call": results,
    }
    name = (
        "instructions-responses.json"
        if args.responses
        else "instructions-messages.json"
        if args.messages
        else "instructions-codex.json"
        if args.codex
        else "instructions.json"
    )
    (RESULTS / name).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The four servers under test, each its own process on 127.0.0.1: emulators, gateway, bare proxy, LiteLLM."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import Proc, StartError, free_port, free_port_block, start, stop_all, wait_http, wait_log
from emulators.registry import read_banner

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
GATEWAY_MODEL = "openai/gpt-4o-mini"
UPSTREAM_MODEL = "gpt-4o-mini"


@dataclass
class Target:
    """One thing the load generator calls, and the process that serves it."""

    name: str
    label: str
    proc: Proc
    url: str  # full URL of chat completions
    key: str
    model: str
    modes: list[bool] = field(default_factory=lambda: [False, True])  # stream off / on: what works
    headers: dict[str, str] = field(default_factory=dict)  # sent with every call besides the key

    def spec(self) -> str:
        only = "" if len(self.modes) != 1 else (",stream" if self.modes[0] else ",nonstream")
        extra = "".join(f",header={name}:{value}" for name, value in self.headers.items())
        return f"{self.name},{self.url},{self.key},{self.model}{only}{extra}"


def router_cmd() -> list[str]:
    return [str(VENV_BIN / "router")]


def start_emulators(logs: Path) -> tuple[Proc, dict[str, tuple[str, str]]]:
    """``router emulators`` on a block of free ports; returns the process and prefix -> (base_url, key)."""
    first = free_port_block(8)  # five providers today; room for a few more
    proc = start(
        "emulators",
        "upstream (emulated providers, aiohttp)",
        [*router_cmd(), "emulators", "--host", "127.0.0.1", "--port", str(first)],
        logs / "emulators.log",
    )
    try:
        text = wait_log(proc, "key=emu-openai-key", 30)
    except BaseException:
        stop_all([proc])
        raise
    return proc, read_banner(text.splitlines())


def _cli(args: list[str], log: Path) -> str:
    done = subprocess.run([*router_cmd(), *args], capture_output=True, text=True, timeout=60, check=False)
    with open(log, "a") as out:
        out.write(f"$ router {' '.join(args)}\n{done.stdout}{done.stderr}\n")
    if done.returncode != 0:
        raise StartError(
            f"router {' '.join(args[:4])} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
        )
    return done.stdout


# the ways the gateway is run: name -> (label, role); see gateway_argv
GATEWAY_SERVERS = {
    "gateway": ("gateway", "our gateway (router serve: hypercorn + Starlette + aiohttp, auth + store)"),
    "gw-uvicorn": ("gw uvicorn", "our gateway under uvicorn (httptools, uvloop), 1 process, same features"),
    "gw-2workers": ("gw 2 workers", "our gateway, router serve --workers 2, PostgreSQL store + Redis limits"),
}


def gateway_argv(name: str, config: Path, port: int) -> tuple[list[str], dict[str, str] | None]:
    if name == "gw-uvicorn":
        return (
            [
                str(VENV_BIN / "uvicorn"),
                "router.asgi:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--loop",
                "uvloop",
                "--http",
                "httptools",
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            {**os.environ, "ROUTER_CONFIG": str(config)},
        )
    argv = [*router_cmd(), "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    return (argv + ["--workers", "2"] if name == "gw-2workers" else argv), None


def start_gateway(
    logs: Path,
    tmp: Path,
    emulators: dict[str, tuple[str, str]],
    name: str = "gateway",
    store_url: str | None = None,
    redis_url: str | None = None,
    *,
    limits: bool = True,
    limit_headers: bool = True,
    access_log: bool = True,
    wrap: list[str] | None = None,
    home: str | None = None,
    in_flight: bool = False,
    store: tuple[str, ...] = (),
) -> Target:
    """Our gateway with every provider on its emulator, a store (temp SQLite unless ``store_url``), a
    rich group and one key, and rate limits on (in Redis if ``redis_url``), served as ``name`` says
    (GATEWAY_SERVERS). ``limits`` / ``limit_headers`` (x-ratelimit-* on admitted answers) /
    ``access_log`` False turn those off (bench.instructions measures what they cost); ``in_flight``
    adds the limits of calls in flight per key and group (high: never reached); ``wrap`` runs the
    server under a tool (``valgrind ...``); ``store``: more lines of the ``[store]`` section."""
    port = free_port()
    home_dir = tmp / (home or name)
    home_dir.mkdir(parents=True, exist_ok=True)
    config = home_dir / "router.toml"
    store_url = store_url or "sqlite:///" + str(home_dir / "router.db")
    lines = [
        "[server]",
        'host = "127.0.0.1"',
        f"port = {port}",
        "",
        "[store]",
        f"url = {json.dumps(store_url)}",
        *store,
        "",
    ]
    if limits:
        # every feature on: rate limits checked on every call (per key and per group, requests and
        # tokens), set high enough that the benchmark never hits them
        lines += [
            "[limits]",
            "key_rpm = 100000000",
            "key_tpm = 100000000000",
            "group_rpm = 100000000",
            "group_tpm = 100000000000",
            *(["key_concurrent = 100000", "group_concurrent = 100000"] if in_flight else []),
            *(
                [f"redis_url = {json.dumps(redis_url)}", f'redis_prefix = "bench-{port}:"']
                if redis_url
                else []
            ),
            *([] if limit_headers else ["headers = false"]),
            "",
        ]
    if not access_log:
        lines += ["[observability]", "access_log = false", ""]
    for prefix, (base_url, key) in sorted(emulators.items()):
        lines += [
            f"[providers.{prefix}]",
            f"base_url = {json.dumps(base_url)}",
            f"api_key = {json.dumps(key)}",
            "",
        ]
    config.write_text("\n".join(lines))
    cli_log = logs / f"{name}-setup.log"
    cli_log.write_text("")
    _cli(["--config", str(config), "groups", "create", "bench", "--credits", "1000000000"], cli_log)
    key = _cli(["--config", str(config), "keys", "create", "--group", "bench", "--name", "bench"], cli_log)
    key = key.strip().splitlines()[-1].strip()
    label, role = GATEWAY_SERVERS[name]
    argv, env = gateway_argv(name, config, port)
    if wrap:
        argv = [*wrap, sys.executable, *argv]  # (the router command is a Python script)
    proc = start(name, role, argv, logs / f"{home or name}.log", env=env, cwd=home_dir)
    return Target(name, label, proc, f"http://127.0.0.1:{port}/v1/chat/completions", key, GATEWAY_MODEL)


def start_bare(
    logs: Path, upstream: str, upstream_key: str, server: str = "hypercorn", wrap: list[str] | None = None
) -> Target:
    port = free_port()
    name = "bare" if server == "hypercorn" else f"bare-{server}"
    argv = [
        *(wrap or ()),
        sys.executable,
        str(ROOT / "bench" / "bare_proxy.py"),
        "--port",
        str(port),
        "--upstream",
        upstream,
        "--key",
        upstream_key,
        "--server",
        server,
    ]
    proc = start(
        name,
        f"bare proxy (bench/bare_proxy.py: {server} + Starlette + aiohttp, no features)",
        argv,
        logs / f"{name}.log",
    )
    label = "bare proxy" if server == "hypercorn" else f"bare {server}"
    return Target(name, label, proc, f"http://127.0.0.1:{port}/v1/chat/completions", "none", UPSTREAM_MODEL)


PG_ADMIN = os.environ.get("BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0")


def _pg_admin(*statements: str) -> None:
    import asyncio

    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(PG_ADMIN, timeout=5)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


def pg_database(name: str) -> str:
    """A fresh PostgreSQL database for the multi-worker gateway (dropped by :func:`drop_pg_database`);
    raises StartError if PostgreSQL or Redis cannot be reached."""
    import redis

    try:
        _pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}")
        with redis.Redis.from_url(REDIS_URL, socket_timeout=5) as client:
            client.ping()
    except Exception as exc:  # noqa: BLE001 - reported as the reason the target is left out
        raise StartError(
            f"needs PostgreSQL at {PG_ADMIN} and Redis at {REDIS_URL}: {type(exc).__name__}: {exc}"
        ) from None
    return f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"


def drop_pg_database(name: str) -> None:
    try:
        _pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    except Exception:  # noqa: BLE001, S110 - best effort cleanup
        pass


def start_litellm(
    logs: Path, tmp: Path, litellm: Path, upstream: str, upstream_key: str, wrap: list[str] | None = None
) -> Target:
    """LiteLLM proxy: one uvicorn worker, no database, quiet logs, a master key (it refuses to run without);
    ``wrap``: under a tool (``valgrind ...``)."""
    port = free_port()
    master = "sk-bench-" + secrets.token_hex(16)
    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {json.dumps(GATEWAY_MODEL)}\n"
        "    litellm_params:\n"
        f"      model: {json.dumps(GATEWAY_MODEL)}\n"
        f"      api_base: {json.dumps(upstream)}\n"
        f"      api_key: {json.dumps(upstream_key)}\n"
        "litellm_settings:\n"
        "  set_verbose: false\n"
        "  json_logs: false\n"
        "general_settings:\n"
        f"  master_key: {json.dumps(master)}\n"
        "  disable_spend_logs: true\n"
    )
    env = dict(os.environ)
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_LOG="ERROR",
        LITELLM_TELEMETRY="False",
        DISABLE_ADMIN_UI="True",
        NO_DOCS="True",
        PYTHONUNBUFFERED="1",
    )
    env.pop("DATABASE_URL", None)
    argv = [
        str(litellm),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    if wrap:
        argv = [*wrap, str(litellm.with_name("python")), *argv]  # (the litellm command is a Python script)
    proc = start(
        "litellm",
        "LiteLLM proxy (uvicorn, 1 worker, no database)",
        argv,
        logs / "litellm.log",
        env=env,
        cwd=tmp,
    )
    return Target(
        "litellm", "litellm", proc, f"http://127.0.0.1:{port}/v1/chat/completions", master, GATEWAY_MODEL
    )


def health_url(target: Target) -> str:
    base = target.url.split("/v1/", 1)[0]
    return base + {"litellm": "/health/liveliness", "portkey": "/"}.get(target.name, "/healthz")


def wait_ready(target: Target, timeout: float) -> None:
    wait_http(target.proc, health_url(target), timeout)


def smoke(target: Target) -> dict[bool, str]:
    """One non-stream and one stream call; returns why each mode that failed did (empty: all fine)."""
    failures: dict[bool, str] = {}
    for stream in (False, True):
        what = "stream" if stream else "non-stream"
        body = {
            "model": target.model,
            "stream": stream,
            "messages": [{"role": "user", "content": "Hi [tokens:3]"}],
        }
        request = urllib.request.Request(
            target.url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {target.key}",
                "Content-Type": "application/json",
                **target.headers,
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            failures[stream] = (
                f"smoke {what} call got HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}"
            )
            continue
        except (urllib.error.URLError, OSError) as exc:
            failures[stream] = f"smoke {what} call failed: {exc}"
            continue
        if not ("data: [DONE]" in text if stream else '"choices"' in text):
            failures[stream] = f"unexpected smoke {what} answer: {text[:300]}"
    return failures


def git_revision() -> str | None:
    """The checkout's short commit, marked if it has uncommitted changes; None without git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except OSError:
        return None
    return head + (" (uncommitted changes)" if dirty else "")

"""Portkey's AI gateway (``@portkey-ai/gateway`` from npm, pinned by bench/portkey/package-lock.json), a
peer measured in the same run as ours.

Installed on first use with ``npm ci --ignore-scripts`` into ``bench/portkey/node_modules`` (git-ignored;
its only install script is a ``patch-package`` step with nothing to patch in the published package) and
started as its README says, ``start-server.js --port=N --headless``, with Node. It routes by request
headers: ``x-portkey-provider: openai`` and ``x-portkey-custom-host`` pointing at our OpenAI emulator.
A failure to install or start is returned as a reason, never raised: the run goes on without it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from bench.procs import Proc, free_port, start
from bench.stack import ROOT, UPSTREAM_MODEL, Target

HOME = ROOT / "bench" / "portkey"
SCRIPT = HOME / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
INSTALL_TIMEOUT = 600.0


def version() -> str | None:
    try:
        return str(json.loads((SCRIPT.parent.parent / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def ensure(log: Path) -> tuple[str | None, str | None]:
    """(the installed version, None) or (None, why it cannot run)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return None, "node and npm are needed to run Portkey's gateway (Debian: apt-get install nodejs npm)"
    wanted = json.loads((HOME / "package.json").read_text())["dependencies"]["@portkey-ai/gateway"]
    if version() != wanted:
        print(f"  installing @portkey-ai/gateway@{wanted} into {HOME.relative_to(ROOT)} (once)", flush=True)
        with open(log, "ab") as out:
            try:
                done = subprocess.run(
                    [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
                    cwd=HOME,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=INSTALL_TIMEOUT,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return None, f"npm ci in {HOME.relative_to(ROOT)} failed: {exc} (see {log})"
        if done.returncode != 0:
            return None, f"npm ci in {HOME.relative_to(ROOT)} exited with {done.returncode} (see {log})"
    found = version()
    if found != wanted or not SCRIPT.exists():
        return (
            None,
            f"@portkey-ai/gateway {wanted} is not installed in {HOME.relative_to(ROOT)} (found {found})",
        )
    return found, None


def start_portkey(logs: Path, upstream: str, upstream_key: str, wrap: list[str] | None = None) -> Target:
    port = free_port()
    argv = [*(wrap or ()), shutil.which("node") or "node", str(SCRIPT), f"--port={port}", "--headless"]
    proc: Proc = start(
        "portkey", f"Portkey AI gateway {version()} (Node, one process)", argv, logs / "portkey.log", cwd=HOME
    )
    headers = {"x-portkey-provider": "openai", "x-portkey-custom-host": upstream}
    return Target(
        "portkey",
        "portkey",
        proc,
        f"http://127.0.0.1:{port}/v1/chat/completions",
        upstream_key,
        UPSTREAM_MODEL,
        headers=headers,
    )

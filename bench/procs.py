"""Starting, watching and stopping the server processes; free ports; CPU time and peak RSS from /proc."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class StartError(Exception):
    """A process did not come up; the message says why (with the tail of its log)."""


@dataclass
class Proc:
    name: str
    role: str
    popen: subprocess.Popen[bytes]
    log: Path
    argv: list[str]
    peak_rss_kb: int | None = None
    stop_seconds: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port``: with SO_REUSEADDR, as the servers bind (socket.create_server,
    aiohttp, hypercorn), so a port whose old connections wait in TIME_WAIT counts as free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(count: int, attempts: int = 200) -> int:
    """First port of ``count`` consecutive free ports (for ``router emulators --port``), below the
    kernel's ephemeral range: after a run of 10,000 streams the ephemeral range is full of TIME_WAIT
    sockets for a minute, and a block next to a port the kernel gave out is then rarely free."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(attempts):
        first = rng.randrange(10_000, max(low - count, 10_001))
        if all(port_is_free(first + i) for i in range(count)):
            return first
    raise StartError(f"found no {count} consecutive free ports on 127.0.0.1")


def start(
    name: str,
    role: str,
    argv: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """Start ``argv`` in its own session (Ctrl-C reaches only the harness, which then stops it)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    return Proc(name, role, popen, log, argv)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


def wait_http(proc: Proc, url: str, timeout: float) -> None:
    """Poll ``url`` until it answers 200, the process exits, or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not proc.alive():
            raise StartError(f"{proc.name} exited with code {proc.popen.returncode}:\n{log_tail(proc.log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise StartError(
        f"{proc.name} did not answer {url} within {timeout:.0f}s ({last}):\n{log_tail(proc.log)}"
    )


def wait_log(proc: Proc, needle: str, timeout: float) -> str:
    """Wait until ``needle`` appears in the process's log; returns the log text."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = proc.log.read_text(errors="replace") if proc.log.exists() else ""
        if needle in text:
            time.sleep(0.3)  # let the lines printed right after it land too
            return proc.log.read_text(errors="replace")
        if not proc.alive():
            break
        time.sleep(0.1)
    raise StartError(f"{proc.name} did not print {needle!r} within {timeout:.0f}s:\n{log_tail(proc.log)}")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (workers, if a server forks any)."""
    out = [pid]
    i = 0
    while i < len(out):
        try:
            for task in os.listdir(f"/proc/{out[i]}/task"):
                with open(f"/proc/{out[i]}/task/{task}/children") as f:
                    out.extend(int(c) for c in f.read().split())
        except OSError:
            pass
        i += 1
    return out


def cpu_seconds(pid: int, only: tuple[str, ...] = ()) -> float:
    """User + system CPU time of the process tree so far. ``only``: count, besides ``pid`` itself, only
    the descendants whose command line holds one of these strings (a PostgreSQL server's backends
    of one database and its writers, not the backends serving someone else)."""
    total = 0
    for p in process_tree(pid):
        if only and p != pid and not any(s in _cmdline(p) for s in only):
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        except (OSError, IndexError, ValueError):
            pass
    return total / CLOCK_TICKS


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def peak_rss_kb(pid: int) -> int | None:
    """VmHWM (peak resident set) of the process tree, summed; None when unreadable."""
    total = 0
    found = False
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
                        found = True
        except OSError:
            pass
    return total if found else None


def stop_all(procs: list[Proc], timeout: float = 8.0) -> None:
    """SIGTERM every process group at once, then SIGKILL those still there after ``timeout`` seconds."""
    began = time.monotonic()
    for proc in procs:
        if proc.alive():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for proc in procs:
        try:
            proc.popen.wait(max(0.1, began + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.notes.append(f"did not stop within {timeout:.0f}s of SIGTERM; killed")
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.popen.wait(5)
        proc.stop_seconds = round(time.monotonic() - began, 2)

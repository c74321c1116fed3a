"""The README's quick start, run as written: every command of its ``sh`` blocks, against a demo on a free
port (the port in the commands swapped for it), in a directory of its own. ``make test`` is the one
command left out: it is this suite."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import free_port
from tests.test_demo import free_ports

ROOT = Path(__file__).resolve().parent.parent
SECTION = re.compile(r"^## Quick start\n(.*?)(?=^## )", re.S | re.M)
BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def commands() -> list[str]:
    """The quick start's commands: each line of its sh blocks (continuations joined, comments dropped)."""
    section = SECTION.search((ROOT / "README.md").read_text())
    assert section, "README.md has a Quick start section"
    out: list[str] = []
    for block in BLOCK.findall(section.group(1)):
        for command in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", command).strip()
            if command:
                out.append(command)
    return out


def test_the_quick_start_commands_run(tmp_path: Path) -> None:
    found = commands()
    assert found[:2] == ["make demo", "make test"], found
    # a directory of its own: the project's Makefile, pyproject and .venv, the demo's data/ apart
    for name in ("Makefile", "pyproject.toml", "uv.lock", ".venv", "scripts"):
        (tmp_path / name).symlink_to(ROOT / name)
    port, emulators = free_port(), free_ports(7)
    env = {**os.environ, "PORT": str(port), "EMULATOR_PORT": str(emulators)}
    log = tmp_path / "demo.out"
    with open(log, "w") as out:
        demo = subprocess.Popen(
            ["bash", "-c", found[0]],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while "Ctrl-C stops it." not in log.read_text() or not _answers(port):  # the banner, once it answers
            assert demo.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        for command in found[2:]:
            done = subprocess.run(
                ["bash", "-c", command.replace("127.0.0.1:8080", f"127.0.0.1:{port}")],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            assert '"object":"chat.completion"' in done.stdout.replace(" ", ""), (command, done.stdout)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGINT)
        demo.wait(30)


def _answers(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False

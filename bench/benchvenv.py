"""The side venv ``.bench-venv``: LiteLLM proxy (pinned) and matplotlib, kept out of the main venv.

Created on first use with the interpreter the main venv is built on. Every step is bounded in time,
and a failure is reported as a reason string, never raised: the benchmark then runs without it.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Newest 1.106.x whose dependencies resolve on the registry we can reach (1.106.3 and later ask for a
# certifi release that is not there). Override with --litellm-version.
LITELLM_VERSION = "1.106.2"
# Releases reported compromised (credential stealers): never installed, whatever is asked.
BLOCKED_VERSIONS = {"1.107.0", "1.82.7", "1.82.8"}
PIP_TIMEOUT = 900.0


@dataclass
class BenchVenv:
    path: Path
    python: Path
    litellm: Path
    litellm_version: str | None = None
    litellm_problem: str | None = None
    matplotlib: bool = False
    matplotlib_problem: str | None = None
    log: list[str] = field(default_factory=list)


def _run(argv: list[str], log: Path, timeout: float) -> tuple[bool, str]:
    with open(log, "ab") as out:
        out.write(("\n$ " + " ".join(argv) + "\n").encode())
        out.flush()
        try:
            done = subprocess.run(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout:.0f}s"
        except OSError as exc:
            return False, str(exc)
    return done.returncode == 0, f"exit code {done.returncode}"


def installed_version(python: Path, dist: str) -> str | None:
    code = f"import importlib.metadata as m\ntry: print(m.version({dist!r}))\nexcept Exception: pass"
    try:
        done = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def suspicious_pth(venv: Path) -> list[str]:
    """.pth files that are not the usual ones: the 2026 LiteLLM compromise shipped ``litellm_init.pth``."""
    usual = {"distutils-precedence.pth", "_virtualenv.pth"}
    found = []
    for pth in venv.glob("lib/python*/site-packages/*.pth"):
        if pth.name not in usual and not pth.name.startswith("__editable__"):
            found.append(pth.name)
    return sorted(found)


def ensure(root: Path, version: str, log: Path, want_litellm: bool = True) -> BenchVenv:
    path = root / ".bench-venv"
    venv = BenchVenv(path, path / "bin" / "python", path / "bin" / "litellm")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    if not venv.python.exists():
        base = getattr(sys, "_base_executable", None) or sys.executable
        print(f"  creating {path} with {base} (first run only)", flush=True)
        ok, why = _run([base, "-m", "venv", str(path)], log, 300)
        if not ok:
            venv.litellm_problem = venv.matplotlib_problem = f"could not create {path}: {why} (see {log})"
            return venv
        _run([str(venv.python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], log, PIP_TIMEOUT)
    pip = [str(venv.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]

    if not want_litellm:
        venv.litellm_problem = "skipped (--no-litellm)"
    elif version in BLOCKED_VERSIONS:
        venv.litellm_problem = f"litellm {version} is a release reported compromised; refusing to install it"
    else:
        current = installed_version(venv.python, "litellm")
        if current != version:
            print(f"  installing litellm[proxy]=={version} into {path} (a minute or two, once)", flush=True)
            ok, why = _run([*pip, f"litellm[proxy]=={version}"], log, PIP_TIMEOUT)
            if not ok:
                venv.litellm_problem = f"pip install 'litellm[proxy]=={version}' failed: {why} (see {log})"
            current = installed_version(venv.python, "litellm")
        if venv.litellm_problem is None:
            if current != version:
                venv.litellm_problem = f"litellm {version} is not importable in {path} (found {current})"
            elif not venv.litellm.exists():
                venv.litellm_problem = f"{venv.litellm} is missing after the install"
            else:
                venv.litellm_version = current
        odd = suspicious_pth(path)
        if odd:
            venv.litellm_version = None
            venv.litellm_problem = (
                f"unexpected .pth files in {path}: {', '.join(odd)}; not running anything from it"
            )
            venv.matplotlib_problem = venv.litellm_problem
            return venv

    if installed_version(venv.python, "matplotlib") is None:
        ok, why = _run([*pip, "matplotlib"], log, PIP_TIMEOUT)
        if not ok:
            venv.matplotlib_problem = f"pip install matplotlib failed: {why} (see {log})"
    venv.matplotlib = installed_version(venv.python, "matplotlib") is not None
    if not venv.matplotlib and venv.matplotlib_problem is None:
        venv.matplotlib_problem = "matplotlib is not importable in .bench-venv"
    return venv

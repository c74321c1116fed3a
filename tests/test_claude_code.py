"""Claude Code itself (``@anthropic-ai/claude-code``, pinned in tests/clients/package.json) against the
gateway on every group, non-interactively (``claude -p``), offline: a plain answer, and a turn where the
model calls Claude Code's own Read tool on a file in a temporary folder, Claude Code reads it and sends
the result back, and the final answer quotes it. Each upstream call is one usage record, billed once.

The emulated models follow directives in the prompt (emulators/directives.py): ``[call:Read {...}]``
makes the model call Read with those arguments; a tool result is answered by quoting it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Stack
from tests.matrix import GROUPS, MODELS

CLAUDE = Path(__file__).parent / "clients" / "node_modules" / ".bin" / "claude"
CONTENT = "The gateway relayed this line from hello.txt."


def claude(
    stack: Stack,
    key: str,
    prompt: str,
    cwd: Path,
    model: str | None,
    *,
    bearer: bool = False,
    extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``claude -p PROMPT`` against the gateway, in ``cwd`` with a fresh home; the key as Claude Code
    sends ANTHROPIC_API_KEY (x-api-key) or, with ``bearer``, ANTHROPIC_AUTH_TOKEN (Authorization)."""
    home = cwd.parent / "home"
    home.mkdir(exist_ok=True)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("ANTHROPIC_", "CLAUDE"))}
    env.update(
        {
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{stack.port}",
            "ANTHROPIC_AUTH_TOKEN" if bearer else "ANTHROPIC_API_KEY": key,
            "HOME": str(home),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no update checks, telemetry or error reports
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",  # a failure shows at once
            **({"ANTHROPIC_MODEL": model} if model else {}),
            **(extra or {}),
        }
    )
    return subprocess.run(
        [str(CLAUDE), "-p", prompt, "--output-format", "json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def result(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    out = json.loads(done.stdout)
    assert out["is_error"] is False, out
    return out


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.txt").write_text(CONTENT + "\n")
    return work


@pytest.mark.parametrize("group", GROUPS)
def test_claude_code_answers_and_reads_a_file_on_every_group(stack: Stack, workdir: Path, group: str) -> None:
    assert CLAUDE.exists(), "make install puts Claude Code in tests/clients/node_modules"
    name = stack.group(50)
    key = stack.key(group=name)
    plain = result(
        claude(stack, key, "Say hello.", workdir, MODELS[group], bearer=group in ("openai", "google"))
    )
    assert plain["result"].strip()
    path = workdir / "hello.txt"
    asked = f'Read hello.txt and tell me its first line. [call:Read {{"file_path": "{path}"}}]'
    read = result(claude(stack, key, asked, workdir, MODELS[group]))
    assert CONTENT in read["result"], read[
        "result"
    ]  # the file's line, read by Claude Code, quoted by the model
    records = stack.run(stack.store.usage(group=name, limit=10))
    # one call for the plain answer, two for the tool turn: each upstream call one record, billed once
    assert len(records) == 3 and all(
        r.status == "ok" and r.endpoint == "messages" and r.credits > 0 for r in records
    )
    assert {r.model for r in records} == {stack.gateway.catalog.resolve(MODELS[group]).id}
    g = stack.run(stack.store.get_group(name))
    assert g is not None and g.reserved == 0 and g.spent == sum(r.credits for r in records)


def test_claude_codes_own_model_names_mapped_by_the_operator(tmp_path: Path, workdir: Path) -> None:
    """Without ANTHROPIC_MODEL Claude Code asks for its own default model by its bare Anthropic name;
    the operator maps it (``[models] map``) to any catalog model, here Gemini."""
    from core.config import ReliabilitySettings, Settings, StoreSettings, parse_settings

    names = parse_settings({"models": {"map": {"claude-opus-5-5": "google/gemini-2.5-flash"}}}).models
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp_path}/router.db"),
        models=names,
        reliability=ReliabilitySettings(max_retries=0, breaker_threshold=10**9),
    )
    mapped = Stack(tmp_path, settings).start()
    try:
        name = mapped.group(50)
        out = result(claude(mapped, mapped.key(group=name), "Say hello.", workdir, None))
        assert out["result"].strip()
        (record,) = mapped.run(mapped.store.usage(group=name))
        assert record.model == "google/gemini-2.5-flash" and record.status == "ok"
        assert mapped.emulator("google").requests  # served by the Gemini emulator
    finally:
        mapped.stop()


def test_out_of_credits_is_shown_as_such(stack: Stack, workdir: Path) -> None:
    key = stack.key(credits=0.0001)
    done = claude(stack, key, "Say hello.", workdir, MODELS["anthropic"])
    out = json.loads(done.stdout)
    assert done.returncode == 1 and out["is_error"] is True
    assert "Credit balance is too low" in out["result"], out

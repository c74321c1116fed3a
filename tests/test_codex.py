"""The Codex CLI itself (``@openai/codex``, pinned in tests/clients/package.json) against the gateway
on every group, as its users configure it: a ``model_providers`` entry with ``wire_api = "responses"``
and ``env_key``, ``codex exec`` non-interactively, offline. A plain answer, and a turn where the model
calls Codex's own shell tool (``exec_command``) to list a temporary folder, Codex runs it and sends the
result back with the reasoning items replayed (``store: false``: the whole conversation each time),
and the final answer quotes the listing. Each upstream call is one usage record, billed once.

What Codex sends on every call (captured from 0.171.0): ``stream``, ``store: false``, ``include:
["reasoning.encrypted_content"]``, ``reasoning.summary``, ``client_metadata``, ``prompt_cache_key``,
``parallel_tool_calls``, function tools, a ``namespace`` tool and the hosted ``web_search``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import Stack

CODEX = Path(__file__).parent / "clients" / "node_modules" / ".bin" / "codex"
# the model each group is tried with (the thinking ones: their state must survive the round trip)
MODELS = {
    "openai": "openai/gpt-5-mini",
    "anthropic": "anthropic/claude-haiku-4-5",
    "google": "google/gemini-3.5-flash",
    "upstage": "upstage/solar-pro3",
    "mistral": "mistral/mistral-small-latest",
}
MARKER = "codex-listed-this-file.txt"


def configure(home: Path, stack: Stack) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f"""model_provider = "gateway"

[model_providers.gateway]
name = "Model router"
base_url = "http://127.0.0.1:{stack.port}/v1"
wire_api = "responses"
env_key = "ROUTER_API_KEY"
request_max_retries = 0
stream_max_retries = 0
""")


def codex(stack: Stack, key: str, model: str, prompt: str, tmp: Path, effort: str | None = "medium") -> str:
    """``codex exec PROMPT`` in ``tmp/work``: its last message."""
    home, work, last = tmp / "codex-home", tmp / "work", tmp / "last-message.txt"
    configure(home, stack)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("OPENAI_", "CODEX_"))}
    env.update({"CODEX_HOME": str(home), "ROUTER_API_KEY": key, "HOME": str(tmp)})
    argv = [
        str(CODEX),
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "-m",
        model,
        "-o",
        str(last),
        *(["-c", f'model_reasoning_effort="{effort}"'] if effort else []),
        prompt,
    ]
    done = subprocess.run(
        argv,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return last.read_text()


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / MARKER).write_text("listed\n")
    return tmp_path


def records(stack: Stack, group: str, calls: int) -> list[Any]:
    found = stack.run(stack.store.usage(group=group, limit=20))
    assert len(found) == calls and all(
        r.status == "ok" and r.endpoint == "responses" and r.credits > 0 for r in found
    )
    g = stack.run(stack.store.get_group(group))
    assert g is not None and g.reserved == 0 and g.spent == sum(r.credits for r in found)
    return found


@pytest.mark.parametrize("group", list(MODELS))
def test_codex_answers_and_runs_its_shell_tool_on_every_group(stack: Stack, tmp: Path, group: str) -> None:
    assert CODEX.exists(), "make install puts the Codex CLI in tests/clients/node_modules"
    name = stack.group(50)
    key = stack.key(group=name)
    assert codex(stack, key, MODELS[group], "Say hello.", tmp).strip()
    folder = tmp / "work"
    asked = f'List the files in {folder}. [call:exec_command {{"cmd": "ls {folder}"}}]'
    answer = codex(stack, key, MODELS[group], asked, tmp)
    assert MARKER in answer, answer  # Codex ran ls, sent its output back, the model quoted it
    found = records(stack, name, 3)  # one call for the plain answer, two for the tool turn
    assert {r.model for r in found} == {stack.gateway.catalog.resolve(MODELS[group]).id}


def test_claudes_thinking_goes_back_to_claude_through_codexs_replay(stack: Stack, tmp: Path) -> None:
    """Codex keeps nothing on the gateway (store: false) and replays the reasoning items it got: Claude's
    signed thinking block comes back sealed in one, and the next call sends it to Anthropic before the
    tool result, so thinking goes on through the tool loop (without it Anthropic drops thinking there)."""
    emulator = stack.emulator("anthropic")
    folder = tmp / "work"
    key = stack.key()
    codex(
        stack, key, MODELS["anthropic"], f'List {folder}. [call:exec_command {{"cmd": "ls {folder}"}}]', tmp
    )
    first, second = emulator.requests[-2:]
    assert "thinking" in first and "thinking" in second  # thinking on both calls of the tool loop
    replayed = second["messages"][-2]["content"]
    assert (
        replayed[0]["type"] == "thinking" and replayed[0]["signature"] and replayed[-1]["type"] == "tool_use"
    )


def test_geminis_thought_signatures_survive_codexs_replay(stack: Stack, tmp: Path) -> None:
    """Gemini 3 refuses a tool loop whose function call lost its thought signature (400); Codex drops
    fields it does not know from the items it replays, so the signature rides in a sealed reasoning item."""
    emulator = stack.emulator("google")
    folder = tmp / "work"
    codex(
        stack,
        stack.key(),
        MODELS["google"],
        f'List {folder}. [call:exec_command {{"cmd": "ls {folder}"}}]',
        tmp,
    )
    contents = emulator.requests[-1]["contents"]
    calls = [
        p for c in contents if c.get("role") == "model" for p in c.get("parts") or () if "functionCall" in p
    ]
    assert calls and calls[0].get("thoughtSignature")


# ------------------------------------------------------------------ the pieces, through the openai SDK

NAMESPACE: Any = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "close_agent",
            "description": "Close an agent.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"target": {"type": "string"}},
                "required": ["target"],
                "additionalProperties": False,
            },
        }
    ],
}
PATCH: Any = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files: a patch, free-form.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}
SHELL: Any = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
CODEX_FIELDS: Any = {
    "client_metadata": {"session_id": "s-1"},
    "prompt_cache_key": "thread-1",
    "include": ["reasoning.encrypted_content"],
    "store": False,
}


@pytest.mark.parametrize("model", ["anthropic/claude-haiku-4-5", "mistral/mistral-small-latest"])
def test_a_namespaced_function_comes_back_with_its_namespace(stack: Stack, model: str) -> None:
    client = stack.client()
    tools = [NAMESPACE, SHELL, {"type": "web_search", "external_web_access": False}]
    out = client.responses.create(
        model=model,
        input='Close it. [call:multi_agent_v1__close_agent {"target": "a1"}]',
        tools=tools,
        reasoning={"summary": "auto"},
        extra_body=CODEX_FIELDS,
    )
    (call,) = [item for item in out.output if item.type == "function_call"]
    assert (
        call.name == "close_agent"
        and call.namespace == "multi_agent_v1"
        and json.loads(call.arguments) == {"target": "a1"}
    )
    events = list(
        client.responses.create(
            model=model,
            input='[call:multi_agent_v1__close_agent {"target": "a2"}]',
            tools=tools,
            stream=True,
            extra_body=CODEX_FIELDS,
        )
    )
    done = [
        e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"
    ]
    assert done[0].name == "close_agent" and done[0].namespace == "multi_agent_v1"
    # the next turn replays the call as Codex does: the provider sees its own (flat) name again
    replay: Any = [
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": "close_agent",
            "namespace": "multi_agent_v1",
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "closed"},
    ]
    after = client.responses.create(model=model, input=replay, tools=tools, extra_body=CODEX_FIELDS)
    assert "closed" in after.output_text


def test_a_free_form_tool_is_a_custom_tool_call_on_every_provider(stack: Stack) -> None:
    client = stack.client()
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    asked = "[call:apply_patch " + json.dumps({"input": patch}) + "]"
    for model in ("anthropic/claude-haiku-4-5", "google/gemini-2.5-flash"):
        out = client.responses.create(model=model, input=asked, tools=[PATCH], extra_body=CODEX_FIELDS)
        (call,) = [item for item in out.output if item.type == "custom_tool_call"]
        assert call.name == "apply_patch" and call.input == patch
        events = list(
            client.responses.create(
                model=model, input=asked, tools=[PATCH], stream=True, extra_body=CODEX_FIELDS
            )
        )
        assert [e.input for e in events if e.type == "response.custom_tool_call_input.done"] == [patch]
        replay: Any = [
            {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch", "input": patch},
            {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Success."},
        ]
        assert "Success." in client.responses.create(model=model, input=replay, tools=[PATCH]).output_text


def test_thinking_as_summary_parts_and_the_sealed_state_guarded(stack: Stack) -> None:
    client = stack.client()
    asked = 'Run it. [think] [call:exec_command {"cmd": "ls"}]'
    events = list(
        client.responses.create(
            model="anthropic/claude-haiku-4-5",
            input=asked,
            tools=[SHELL],
            stream=True,
            reasoning={"effort": "low", "summary": "auto"},
            extra_body=CODEX_FIELDS,
        )
    )
    kinds = [e.type for e in events]
    assert "response.reasoning_summary_text.delta" in kinds and "response.reasoning_text.delta" not in kinds
    final = events[-1].response  # type: ignore[union-attr]
    summary, call, sealed = final.output[0], final.output[-2], final.output[-1]
    assert summary.type == "reasoning" and summary.summary[0].text and call.type == "function_call"
    assert (
        sealed.type == "reasoning"
        and sealed.encrypted_content
        and sealed.encrypted_content.startswith("rtr1.")
    )
    history: Any = [
        {"type": "message", "role": "user", "content": asked},
        *(i.model_dump(exclude_none=True) for i in final.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"},
    ]
    ok = client.responses.create(
        model="anthropic/claude-haiku-4-5",
        input=history,
        tools=[SHELL],
        reasoning={"effort": "low"},
        extra_body=CODEX_FIELDS,
    )
    assert "a.txt" in ok.output_text
    tampered = [
        *history[:-2],
        {**history[-2], "encrypted_content": sealed.encrypted_content[:-4] + "AAAA"},
        history[-1],
    ]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="anthropic/claude-haiku-4-5", input=tampered, tools=[SHELL], extra_body=CODEX_FIELDS
        )
    assert info.value.code == "invalid_encrypted_content" and "encrypted_content" in str(info.value.param)  # type: ignore[attr-defined]
    # OpenAI's own encrypted reasoning (a conversation that moved from an OpenAI model) is not ours: dropped
    foreign = [*history[:-2], {**history[-2], "encrypted_content": "gAAAAABforeign"}, history[-1]]
    assert client.responses.create(
        model="anthropic/claude-haiku-4-5", input=foreign, tools=[SHELL]
    ).output_text


def test_the_openai_emulator_takes_what_codex_sends(stack: Stack) -> None:
    """The real API takes client_metadata and namespace tools (Codex sends both to OpenAI): the emulator
    too, straight through the openai SDK and through the gateway."""
    running = stack.emulators["openai"]
    direct = openai.OpenAI(base_url=running.base_url, api_key=running.api_key, max_retries=0)
    tools = [NAMESPACE, SHELL, {"type": "web_search", "external_web_access": False}]
    try:
        out = direct.responses.create(
            model="gpt-5-mini",
            input="hi",
            tools=tools,
            reasoning={"summary": "auto"},
            parallel_tool_calls=True,
            extra_body=CODEX_FIELDS,
        )
        assert out.output_text
    finally:
        direct.close()
    out = stack.client().responses.create(
        model="openai/gpt-5-mini", input="hi", tools=tools, extra_body=CODEX_FIELDS
    )
    assert out.output_text and stack.emulator("openai").requests[-1]["client_metadata"] == {
        "session_id": "s-1"
    }


def test_prompt_cache_key_caches_claudes_instructions(stack: Stack) -> None:
    """Codex sends prompt_cache_key and a long system prompt each turn: on Claude the instructions are
    marked for Anthropic's prompt cache, so the next turn reads them from it (billed at the cached price)."""
    client = stack.client()
    instructions = " ".join(f"rule{i} keep answers short" for i in range(400))
    body: Any = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": instructions}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
    ]
    first = client.responses.create(model="anthropic/claude-haiku-4-5", input=body, extra_body=CODEX_FIELDS)
    second = client.responses.create(model="anthropic/claude-haiku-4-5", input=body, extra_body=CODEX_FIELDS)
    assert first.usage is not None and second.usage is not None
    assert (
        first.usage.input_tokens_details.cached_tokens == 0
        and second.usage.input_tokens_details.cached_tokens > 1024
    )
    plain = {k: v for k, v in CODEX_FIELDS.items() if k != "prompt_cache_key"}
    again = client.responses.create(model="anthropic/claude-haiku-4-5", input=body, extra_body=plain)
    assert (
        again.usage is not None and again.usage.input_tokens_details.cached_tokens == 0
    )  # not asked: not marked

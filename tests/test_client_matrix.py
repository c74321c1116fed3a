"""The client matrix, Node side: the OpenAI Node SDK and the Vercel AI SDK (three providers), as
installed from tests/clients/package-lock.json, against the real gateway and its emulators on
loopback. Each script in tests/clients/ runs once per session with every cell (client × provider
group × feature) and writes a JSON report; each cell is asserted here on its own."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Stack
from tests.matrix import (
    GROUPS,
    MODELS,
    check_chat,
    check_image,
    check_image_refused,
    check_structured,
    check_tools,
)

CLIENTS_DIR = Path(__file__).parent / "clients"
SCRIPTS = {
    "openai_node.mjs": ["openai-node"],
    "ai_sdk.mjs": ["ai-sdk-openai-chat", "ai-sdk-openai-responses", "ai-sdk-openai-compatible"],
}
CLIENTS = [client for clients in SCRIPTS.values() for client in clients]
# Cells neither run nor tested (none: the AI SDK's Responses mode refers to earlier output by id,
# item_reference, which the gateway resolves from its own store for every group).
WAITING: list[str] = []


def cells(feature: str) -> list[tuple[str, str]]:
    return [(c, g) for c in CLIENTS for g in GROUPS if f"{c}/{g}/{feature}" not in WAITING]


@pytest.fixture(scope="module")
def report(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both scripts at once against one gateway, each with a key of its own."""
    out = tmp_path_factory.mktemp("matrix")
    running = []
    for script in SCRIPTS:
        env = dict(
            os.environ,
            ROUTER_BASE_URL=stack.base_url,
            ROUTER_API_KEY=stack.key(1_000),
            ROUTER_MODELS=json.dumps(MODELS),
            ROUTER_WAITING=json.dumps(WAITING),
            ROUTER_REPORT=str(out / f"{script}.json"),
        )
        log = open(out / f"{script}.log", "w")  # closed once the script has exited
        running.append(
            (
                script,
                log,
                subprocess.Popen(
                    ["node", script], cwd=CLIENTS_DIR, env=env, stdout=log, stderr=subprocess.STDOUT
                ),
            )
        )
    cells: dict[str, Any] = {}
    for script, log, process in running:
        code = process.wait(timeout=300)
        log.close()
        assert code == 0, f"{script} exited {code}: {(out / f'{script}.log').read_text()[-3000:]}"
        cells.update(json.loads((out / f"{script}.json").read_text()))
    return cells


def cell(report: dict[str, Any], client: str, group: str, feature: str) -> dict[str, Any]:
    found = report[f"{client}/{group}/{feature}"]
    assert found["ok"], f"{client} {group} {feature}: {found}"
    return found["data"]


@pytest.mark.parametrize(("client", "group"), cells("chat"))
def test_chat(report: dict[str, Any], client: str, group: str) -> None:
    check_chat(cell(report, client, group, "chat"), MODELS[group])


@pytest.mark.parametrize(("client", "group"), cells("stream"))
def test_stream_with_usage(report: dict[str, Any], client: str, group: str) -> None:
    check_chat(cell(report, client, group, "stream"), MODELS[group])


@pytest.mark.parametrize(
    ("client", "group"), [(c, g) for c, g in cells("conversation") if c.startswith("ai-sdk")]
)
def test_two_turn_conversation(stack: Stack, report: dict[str, Any], client: str, group: str) -> None:
    data = cell(report, client, group, "conversation")
    check_chat(data, MODELS[group])
    assert data["usage"]["input"] > data["first_usage"]["input"]  # the first turn was sent again
    if client == "ai-sdk-openai-responses":  # by reference: the stored first answer became the second's input
        db = stack.gateway.store.database
        [(first,)] = stack.run(db.select("SELECT body FROM responses WHERE id = ?", (data["first_id"],)))
        [(second,)] = stack.run(db.select("SELECT input FROM responses WHERE id = ?", (data["second_id"],)))
        answer = json.loads(first)["output"][-1]
        assert answer["type"] == "message" and answer["id"] in second
        assert answer["content"][0]["text"] in second


@pytest.mark.parametrize(("client", "group"), cells("tools"))
def test_tool_loop(report: dict[str, Any], client: str, group: str) -> None:
    check_tools(cell(report, client, group, "tools"))


@pytest.mark.parametrize(("client", "group"), cells("image"))
def test_image_input(stack: Stack, report: dict[str, Any], client: str, group: str) -> None:
    if stack.gateway.catalog.resolve(MODELS[group]).image_input:
        check_image(cell(report, client, group, "image"))
    else:
        found = report[f"{client}/{group}/image"]
        check_image_refused(found, found.get("status"), found.get("body"))


@pytest.mark.parametrize(("client", "group"), cells("structured"))
def test_structured_output(report: dict[str, Any], client: str, group: str) -> None:
    check_structured(cell(report, client, group, "structured"))

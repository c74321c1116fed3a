"""The packages' layers (pyproject.toml [tool.importlinter], drawn in docs/architecture.md): no package
imports one above it, siblings on one layer import neither way. Run here so CI keeps them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from adapters import ADAPTERS, check_registry
from core.catalog import PROTOCOLS, Catalog

ROOT = Path(__file__).resolve().parent.parent


def test_the_layers_contract_is_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_every_catalog_protocol_has_exactly_one_adapter() -> None:
    assert sorted(ADAPTERS) == sorted(PROTOCOLS)
    assert {spec.protocol for spec in Catalog.load().providers.values()} <= set(ADAPTERS)
    check_registry(ADAPTERS, PROTOCOLS)


def test_a_registry_that_misses_or_misnames_a_protocol_is_refused() -> None:
    without_gemini = {name: cls for name, cls in ADAPTERS.items() if name != "gemini"}
    with pytest.raises(TypeError, match=r"missing \['gemini'\]"):
        check_registry(without_gemini, PROTOCOLS)
    with pytest.raises(TypeError, match=r"registered under another name \['gemini'\]"):
        check_registry({**without_gemini, "gemini": ADAPTERS["anthropic"]}, PROTOCOLS)
    with pytest.raises(TypeError, match=r"unknown \['bedrock'\]"):
        check_registry({**ADAPTERS, "bedrock": ADAPTERS["openai"]}, PROTOCOLS)

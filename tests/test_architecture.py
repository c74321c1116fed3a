"""The packages' layers (pyproject.toml [tool.importlinter], drawn in docs/architecture.md): no package
imports one above it, siblings on one layer import neither way. Run here so CI keeps them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from adapters import ADAPTERS, check_registry
from core.catalog import PROTOCOLS, Catalog
from tests.conftest import PRODUCT_PACKAGES, ROOT


def test_the_layers_contract_is_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
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


# the circles there are today, each to be broken: take its line out when it is (issue 57 broke the last)
KNOWN: list[set[str]] = []


def _imports(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module of ``packages`` and the ones of theirs it imports: anywhere in it, under
    ``TYPE_CHECKING`` and inside functions too."""
    paths = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    found: dict[str, set[str]] = {}
    for name, path in paths.items():
        found[name] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found[name] |= {alias.name for alias in node.names if alias.name in paths}
            elif isinstance(node, ast.ImportFrom) and node.module in paths:  # a module of it, else the module
                found[name] |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in paths else node.module
                    for a in node.names
                }
    return found


def _circles(imports: dict[str, set[str]]) -> list[set[str]]:
    """The sets of modules each of which imports every other one, directly or through others."""
    reach: dict[str, set[str]] = {}
    for start in imports:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for name in imports[todo.pop()] - seen:
                seen.add(name)
                todo.append(name)
        reach[start] = seen
    circles = {frozenset(n for n in reach[m] if m in reach[n]) for m in imports if m in reach[m]}
    return sorted((set(c) for c in circles), key=sorted)


def test_no_new_circle_of_modules_importing_each_other() -> None:
    circles = _circles(_imports(ROOT, PRODUCT_PACKAGES))
    assert [c for c in circles if c not in KNOWN] == []
    assert [c for c in KNOWN if c not in circles] == []  # broken: take it out of KNOWN


def test_circles_are_found_through_other_modules_type_checking_and_functions(tmp_path: Path) -> None:
    (tmp_path / "p" / "q").mkdir(parents=True)
    files = {
        "p/__init__.py": "",
        "p/q/__init__.py": "",
        "p/d.py": "import os\n",
        "p/a.py": "from p.q import b\n",
        "p/q/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import c\n",
        "p/c.py": "import p.d\n\ndef late():\n    from p import a\n",
    }
    for path, text in files.items():
        (tmp_path / path).write_text(text)
    imports = _imports(tmp_path, ("p",))
    assert imports["p.q.b"] == {"p.c"} and imports["p.c"] == {"p.d", "p.a"}
    assert _circles(imports) == [{"p.a", "p.q.b", "p.c"}]

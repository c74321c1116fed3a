"""No feature runs code or starts a process from the configuration, the admin API or a call: the
product's modules (their syntax trees) use no ``eval``/``exec``/``compile``/``__import__``, import no
module that runs code or processes (``subprocess``, ``pickle``, ``marshal``, ``shelve``, ``runpy``,
``code``, ``pty``, ``importlib`` other than ``importlib.metadata``), call no ``os.system``/``popen``/
``exec*``/``spawn*``, and build no Jinja template from a string (the console's templates are files of
the package, autoescaped). Webhooks only send HTTP to checked addresses (core/destinations.py).

``ALLOWED`` names each exception and why it does not take its command from configuration or input.
"""

from __future__ import annotations

import ast

from tests.conftest import PRODUCT_PACKAGES as PACKAGES
from tests.conftest import ROOT

MODULES = {
    "subprocess",
    "pickle",
    "marshal",
    "shelve",
    "runpy",
    "code",
    "pty",
    "importlib",
    "ctypes",
    "multiprocessing",
}
BUILTINS = {"eval", "exec", "compile", "__import__"}
TEMPLATES = {"from_string", "Template"}  # a Jinja template from a string, not from the package's files
OS_CALLS = ("system", "popen", "exec", "spawn", "fork", "posix_spawn")

# (module, what): why it runs no command taken from configuration or input
ALLOWED = {
    (
        "server/serve.py",
        "subprocess",
    ): "router serve --workers N: the workers are `python -m cli serve` with the parent's own arguments",
}


def problems_in(module: str, source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name != "importlib.metadata"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module != "importlib.metadata":
            names = [node.module] + (
                [f"{node.module}.{a.name}" for a in node.names] if node.module == "os" else []
            )
        elif isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name in BUILTINS and isinstance(func, ast.Name) or name in TEMPLATES:
                names = [name]
            elif name == "Environment" and not any(
                k.arg == "autoescape" and getattr(k.value, "value", None) is True for k in node.keywords
            ):
                names = ["Environment without autoescape=True"]
            elif (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "os"
                and name.startswith(OS_CALLS)
            ):
                names = [f"os.{name}"]
        for name in names:
            top = name.split(".")[0]
            bad = (
                top in MODULES
                or name in BUILTINS | TEMPLATES
                or name.startswith("Environment")
                or (name.startswith("os.") and name[3:].startswith(OS_CALLS))
            )
            if bad and (module, top if top in MODULES else name) not in ALLOWED:
                found.append(f"{module}:{node.lineno}: {name}")
    return found


def test_the_product_runs_no_code_and_no_process_from_data() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = str(path.relative_to(ROOT))
            found += problems_in(module, path.read_text(encoding="utf-8"))
    assert not found, "code or processes run from data:\n" + "\n".join(found)


def test_the_scan_finds_each_kind() -> None:
    for source in (
        "import subprocess",
        "from subprocess import run",
        "import pickle",
        "import importlib",
        "eval(x)",
        "exec(x)",
        "compile(x, 'f', 'exec')",
        "__import__(name)",
        "os.system(cmd)",
        "os.execvp(a, b)",
        "from os import system",
        "env.from_string(text)",
        "jinja2.Template(text)",
        "jinja2.Environment(loader=x)",
        "jinja2.Environment(loader=x, autoescape=False)",
    ):
        assert problems_in("m.py", source), source
    assert (
        problems_in(
            "m.py",
            "import importlib.metadata\nre.compile('x')\njinja2.Environment(loader=x, autoescape=True)",
        )
        == []
    )
    assert problems_in("server/serve.py", "import subprocess") == []

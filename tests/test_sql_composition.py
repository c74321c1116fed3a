"""No SQL built from strings that could carry input: every SQL text the product composes is made of
constants.

The rule, checked on the syntax tree of every module of the product packages: a string built at run
time (an f-string, ``+``, ``%`` or ``.format``) whose literal text reads as SQL (``SELECT``, ``INSERT
INTO``, ``UPDATE .. SET``, ``DELETE FROM``, ``CREATE``/``ALTER``/``DROP TABLE``/``INDEX``, ``WITH``)
may put into it only *constant* parts:

- string and number literals, and f-strings, concatenations and repetitions of constants;
- names bound only to constants: module-level ones (or UPPER_CASE names imported from another module
  of the product, which are checked there), and local ones, however often assigned or appended to, a
  loop's or a comprehension's variable over a constant;
- ``<constant>.join(<constants>)``, ``"?" * n`` (the placeholders of n values: a count is no text),
  ``len``/``range``/``int`` of anything, a choice between constants (``a if c else b``), and an item of
  a constant table (``COLUMNS[kind]``: the table is ours, whatever the key);
- the few parameters and attributes listed in ``CHOSEN`` below, each with the reason their value is
  one of the code's own names, never input.

Values go to the database as parameters (``?``, ``$1``), never into the text. ruff's S608 flags less
precisely; the modules listed under it in pyproject.toml are held to this rule instead.
"""

from __future__ import annotations

import ast
import re

from tests.conftest import PRODUCT_PACKAGES as PACKAGES
from tests.conftest import ROOT

SQL = re.compile(
    r"\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM|(CREATE|ALTER|DROP) (TABLE|INDEX|UNIQUE)|WITH)\b"
)
NUMBERS = {"len", "range", "int", "float", "min", "max"}

# (module, function, name): a parameter or attribute whose value is one of the code's own names
CHOSEN: dict[tuple[str, str, str], str] = {
    (
        "billing/usage_filter.py",
        "where",
        "value",
    ): "written only when it is one of _LITERALS' constants (value in known)",
    (
        "billing/analysis.py",
        "_select",
        "by",
    ): "Filter fields chosen by the console's code; Level.serves checks them against its dims",
    ("billing/analysis.py", "_select", "hour"): "one of the SQL expressions of the hour this module writes",
    (
        "billing/analysis.py",
        "_rolled",
        ".table",
    ): "a rollup level's table: the constants of billing/rollup.py LEVELS",
    ("billing/rollup.py", "rebuild", ".table"): "a rollup level's table: the constants of LEVELS",
    ("billing/rollup.py", "script", ".table"): "the level's own table name, a constant of LEVELS",
    ("billing/rollup.py", "script", ".dims"): "the level's dimensions, constants of LEVELS",
    ("billing/rollup.py", "script", ".indexes"): "the level's indexes, constants of LEVELS",
    ("billing/rollup.py", "roll", ".table"): "the level's own table name, a constant of LEVELS",
    ("billing/rollup.py", "roll", ".dims"): "the level's dimensions, constants of LEVELS",
    ("billing/rollup.py", "roll", ".width"): "the level's width in seconds, a number of LEVELS",
    (
        "billing/history.py",
        "totals",
        "by",
    ): "checked to be 'model' or 'deployment' first (ValueError otherwise)",
    ("billing/history.py", "_exists", "clause"): "its callers pass literals ('id < ?', 'id > ?', 'id >= ?')",
    ("billing/history.py", "_exists", "base"): "its callers pass the SQL of _where (a builder, checked)",
    ("billing/history.py", "buckets", "expr"): "the bucket expression this module writes from numbers",
    (
        "billing/postgres_pool.py",
        "migrate",
        "table",
    ): "a version table's name: a literal or VERSION_TABLE constant of each store",
    (
        "billing/schema.py",
        "ddl",
        "scripts",
    ): "the stores' DDL constants (LEDGER, TABLES, MIGRATIONS) its callers pass",
    (
        "billing/sqlite_thread.py",
        "_migrate",
        "table",
    ): "a version table's name: a literal or VERSION_TABLE constant of each store",
}
# functions that return SQL (or (SQL, arguments)): name -> module:function, whose returns this rule checks
BUILDERS = {
    "_where": "billing/history.py:_where",
    "where": "billing/usage_filter.py:where",
    "ddl": "billing/schema.py:ddl",
}


def _sql_text(node: ast.AST) -> str:
    return " ".join(
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )


class Checker:
    def __init__(self, module: str, tree: ast.Module) -> None:
        self.module, self.tree = module, tree
        self.parents: dict[ast.AST, ast.AST] = {}
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
        self.functions = {
            n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)
        }  # a call: what it returns
        self.imported = {
            a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
        }

    def scope_of(self, node: ast.AST) -> ast.AST:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                return node
        return self.tree

    def bindings(self, scope: ast.AST, name: str) -> list[ast.AST] | None:
        """What ``name`` is bound to in ``scope`` (values assigned, appended, iterated), or None when
        it is a parameter of ``scope``."""
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = scope.args
            if name in {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}:
                return None
        values: list[ast.AST] = []
        for node in ast.walk(scope):
            if self.scope_of(node) is not scope:
                continue
            if isinstance(node, ast.Assign) and any(_names(t, name) for t in node.targets):
                target = node.targets[0]
                if isinstance(target, ast.Tuple) and isinstance(
                    node.value, ast.Call
                ):  # `sql, args = where(...)`
                    values.append(ast.Subscript(node.value, ast.Constant(_position(target, name))))
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    values.append(node.value.elts[_position(target, name)])
                else:
                    values.append(node.value)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and _names(node.target, name) and node.value:
                values.append(node.value)
            elif isinstance(node, ast.For | ast.comprehension) and _names(node.target, name):
                rows = node.iter.elts if isinstance(node.iter, ast.Tuple | ast.List) else []
                if (
                    isinstance(node.target, ast.Tuple)
                    and rows
                    and all(isinstance(r, ast.Tuple) for r in rows)
                ):
                    values += [r.elts[_position(node.target, name)] for r in rows]  # type: ignore[attr-defined]
                else:
                    values.append(node.iter)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("append", "extend")
                and _names(node.func.value, name)
            ):
                values.extend(node.args)
        return values

    def constant(self, node: ast.AST, seen: frozenset[str] = frozenset()) -> bool:
        match node:
            case ast.Constant():
                return True
            case ast.JoinedStr():
                return all(
                    self.constant(v.value, seen) for v in node.values if isinstance(v, ast.FormattedValue)
                )
            case ast.BinOp(op=ast.Mult()):
                return self.constant(node.left, seen) or self.constant(node.right, seen)
            case ast.BinOp():
                return self.constant(node.left, seen) and self.constant(node.right, seen)
            case ast.IfExp():
                return self.constant(node.body, seen) and self.constant(node.orelse, seen)
            case ast.BoolOp():
                return all(self.constant(v, seen) for v in node.values)
            case ast.Tuple() | ast.List() | ast.Set():
                return all(self.constant(e, seen) for e in node.elts)
            case ast.Dict():
                return all(self.constant(v, seen) for v in node.values)
            case ast.ListComp() | ast.GeneratorExp() | ast.SetComp():
                return self.constant(node.elt, seen)
            case ast.Subscript(
                value=ast.Call(func=ast.Name(id=fn) | ast.Attribute(attr=fn)), slice=ast.Constant(value=i)
            ):
                return fn in BUILDERS and _builds(fn, i)  # an element of what a builder returns
            case ast.Subscript():
                return self.constant(node.value, seen)
            case ast.Starred():
                return self.constant(node.value, seen)
            case ast.Call(func=ast.Name(id=fn)) if fn in NUMBERS:
                return True
            case ast.Call(
                func=ast.Attribute(
                    attr="join"
                    | "format"
                    | "format_map"
                    | "upper"
                    | "lower"
                    | "strip"
                    | "split"
                    | "get"
                    | "items"
                    | "keys"
                    | "values"
                )
            ):
                return self.constant(node.func.value, seen) and all(self.constant(a, seen) for a in node.args)
            case ast.Call(
                func=ast.Name(
                    id="repr"
                    | "str"
                    | "tuple"
                    | "list"
                    | "sorted"
                    | "enumerate"
                    | "zip"
                    | "set"
                    | "frozenset"
                )
            ):
                return all(self.constant(a, seen) for a in node.args)
            case ast.Call(func=ast.Name(id=fn)) if fn in self.functions and fn not in seen:
                returns = [
                    n.value for n in ast.walk(self.functions[fn]) if isinstance(n, ast.Return) and n.value
                ]
                return all(self.constant(r, seen | {fn}) for r in returns)
            case ast.Attribute():
                return (
                    node.attr.isupper()
                    or (self.module, _func_name(self.scope_of(node)), f".{node.attr}") in CHOSEN
                )
            case ast.Name(id=name):
                return self.name(node, name, seen)
        return False

    def name(self, node: ast.AST, name: str, seen: frozenset[str]) -> bool:
        scope = self.scope_of(node)
        if (self.module, _func_name(scope), name) in CHOSEN:
            return True
        key = f"{id(scope)}:{name}"
        if key in seen:  # bound in a loop to itself plus constants: constant if the rest are
            return True
        while True:
            values = self.bindings(scope, name)
            if values is None:
                return (self.module, _func_name(scope), name) in CHOSEN
            if values or scope is self.tree:
                break
            scope = self.scope_of(scope)  # a closure's name: the enclosing function's
        if not values:
            return name in self.imported and name.lstrip("_").isupper()
        return all(self.constant(v, seen | {key}) for v in values)

    def problems(self) -> list[str]:
        found = []
        for node in ast.walk(self.tree):
            built = (
                isinstance(node, ast.JoinedStr)
                or (
                    isinstance(node, ast.BinOp)
                    and isinstance(node.op, ast.Add | ast.Mod)
                    and not isinstance(self.parents.get(node), ast.BinOp)
                )
                or (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "format"
                )
            )
            if built and SQL.search(_sql_text(node)) and not self.constant(node):
                found.append(f"{self.module}:{node.lineno}: {ast.unparse(node)[:120]}")
        return found


def _position(target: ast.Tuple, name: str) -> int:
    return next(i for i, e in enumerate(target.elts) if _names(e, name))


def _builds(fn: str, index: int) -> bool:
    """Every ``return`` of the builder ``fn`` gives a constant at ``index`` (or is one, for index 0)."""
    module, function = BUILDERS[fn].split(":")
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    checker = Checker(module, tree)
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    returns = [r.value for f in found for r in ast.walk(f) if isinstance(r, ast.Return) and r.value]
    parts = [r.elts[index] if isinstance(r, ast.Tuple) else r for r in returns]
    return bool(parts) and all(
        _builds(_called(p), index) if _called(p) in BUILDERS else checker.constant(p) for p in parts
    )


def _called(node: ast.AST) -> str:
    func = getattr(node, "func", None)
    return getattr(func, "id", "") or getattr(func, "attr", "") if isinstance(node, ast.Call) else ""


def _names(target: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target))


def _func_name(scope: ast.AST) -> str:
    return getattr(scope, "name", "")


def problems_in(module: str, source: str) -> list[str]:
    return Checker(module, ast.parse(source)).problems()


def test_the_product_composes_sql_from_constants_only() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = str(path.relative_to(ROOT))
            found += problems_in(module, path.read_text(encoding="utf-8"))
    assert not found, "SQL built from a value that is not a constant:\n" + "\n".join(found)


def test_the_rule_finds_input_in_sql_and_accepts_constants() -> None:
    bad = {
        "param": "def f(db, name):\n    return db.execute(f'SELECT id FROM groups WHERE name = {name}')",
        "concat": "def f(db, name):\n    db.execute('DELETE FROM keys WHERE id = ' + name)",
        "percent": "def f(db, v):\n    db.execute('UPDATE groups SET balance = %s' % v)",
        "format": "def f(db, v):\n    db.execute('SELECT * FROM t WHERE a = {}'.format(v))",
        "a local from input": "def f(db, req):\n    col = req.query['c']\n    db.execute(f'SELECT {col} FROM t')",
        "appended input": "def f(db, req):\n    w = ['a = ?']\n    w.append(req.q)\n    db.execute(f'SELECT 1 FROM t WHERE {\" AND \".join(w)}')",
        "str of input": "def f(db, v):\n    db.execute(f'SELECT 1 FROM t LIMIT {str(v)}')",
    }
    for what, source in bad.items():
        assert problems_in("m.py", source), what
    good = (
        "COLS = ('a', 'b')\nSELECT = f\"SELECT {', '.join(COLS)} FROM t\"\n"
        "def f(db, ids, desc):\n"
        "    marks = ', '.join('?' * len(ids))\n"
        "    order = 'DESC' if desc else 'ASC'\n"
        "    w = ['a = ?']\n    w.append('b > ?')\n"
        "    return db.execute(f'{SELECT} WHERE id IN ({marks}) AND {\" AND \".join(w)} ORDER BY id {order}', ids)"
    )
    assert problems_in("m.py", good) == []

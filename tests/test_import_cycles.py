"""No file-level import cycle in the library, counting imports placed inside functions.

A cycle that Python tolerates today (because one side imports inside a function) still means neither file can be
read, tested or moved without the other; this walks the source (no import is executed) and fails on any cycle.
`PYTHONPATH=. python tests/test_import_cycles.py` prints the cycles and how many imports sit inside functions.

Imports under `if TYPE_CHECKING:` are left out: they never run, and they are how a type names its neighbour.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import tomllib

from mechanisms.framework.integrity import OWN_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("privbench", *OWN_PACKAGES)  # the library's own packages and its facade
def modules() -> dict[str, Path]:
    """Every library module by dotted name (a package by its own name, for its __init__.py)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, inside: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Each import statement with whether it sits inside a function; TYPE_CHECKING blocks are skipped."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking_only(node):
            yield from (pair for child in node.orelse for pair in _imports(ast.Module(body=[child]), inside))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, inside
        yield from _imports(node, inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, known: dict[str, Path]) -> set[str]:
    """The library modules one import statement loads (`from a import b` loads a.b when that is a module)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = node.module or ""
    if node.level:
        here = name.split(".") if is_package else name.split(".")[:-1]
        here = here[:len(here) - (node.level - 1)]
        base = ".".join(here + ([base] if base else []))
    found = {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known}
    if base in known and len(found) < len(node.names):
        found.add(base)
    return found


def import_graph() -> tuple[dict[str, set[str]], int]:
    """Module -> the library modules it imports anywhere in its file; and how many imports sit inside functions."""
    known = modules()
    graph: dict[str, set[str]] = {}
    inner = 0
    for name, path in known.items():
        edges = graph.setdefault(name, set())
        for node, inside in _imports(ast.parse(path.read_text(), str(path))):
            targets = _targets(node, name, path.name == "__init__.py", known)
            inner += inside and bool(targets)
            edges |= targets - {name}
    return graph, inner


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted; the known one dropped."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_walk_sees_imports_inside_functions():
    """The checker must count what it claims to count: a function-level import is an edge."""
    tree = ast.parse("import os\ndef f():\n    from mechanisms.accounting import reference\n")
    assert [inside for _, inside in _imports(tree)] == [False, True]
    graph, _ = import_graph()
    assert graph and any(graph.values())


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_list_is_declared_once():
    """pyproject's packages (what is installed) are privbench's own (what the integrity checks trust, what Ray
    ships) and the facade: the one list, `integrity.OWN_PACKAGES`, and this derived copy must agree."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert sorted(found["include"]) == sorted(f"{p}*" for p in PACKAGES)
    assert sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests") == \
        sorted(PACKAGES)


def test_no_import_cycle():
    found = cycles(import_graph()[0])
    assert found == [], "import cycles (imports inside functions count):\n" + "\n".join(
        " <-> ".join(c) for c in found)


if __name__ == "__main__":
    graph, inner = import_graph()
    for component in cycles(graph):
        print(" <-> ".join(component))
    print(f"{len(cycles(graph))} cycles (beside the framework's known one); {inner} imports inside functions")

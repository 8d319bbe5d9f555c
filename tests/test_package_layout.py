"""The house rules of ``rlrunner/`` that a reader relies on: every module imports on its own, no two modules import
each other (directly or around a loop, lazy imports inside functions included), and no file exceeds 400 lines."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlrunner"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """The ``rlrunner`` modules ``name`` imports anywhere in its file (``from pkg import sub`` counts as ``sub``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names)
    return {m for m in found if m in MODULES and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_cycle_finder_finds_a_loop_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_circle_in_rlrunner():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    assert graph["rlrunner.models"] >= {"rlrunner.models.base", "rlrunner.models.lora"}  # the parser sees imports
    assert _cycles(graph) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_imports_on_its_own(name):
    importlib.import_module(name)


def test_no_file_over_400_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these by idea: {long}"

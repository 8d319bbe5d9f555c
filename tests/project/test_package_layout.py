"""The house rules of ``rlrunner/`` that a reader relies on: every module imports on its own, no two modules import
each other (directly or around a loop, lazy imports inside functions included), no file exceeds 400 lines, the top
level holds packages (few modules), every package says in its docstring what it holds and which packages it imports
(and does import exactly those), and docs/layout.md is what ``scripts/layout.py`` makes of those docstrings now."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rlrunner"
MAX_LINES = 400
MAX_TOP_LEVEL_MODULES = 4  # besides __init__.py and __main__.py: the top level shows packages


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


def _package_of(module: str) -> str:
    """``rlrunner.<package>`` (or the top-level module, ``rlrunner.recipe``) that ``module`` belongs to."""
    return ".".join(module.split(".")[:2])


def test_packages_form_floors():
    """No loop between packages either (models -> sizing -> models was one): each package imports only packages
    on the floors below it, so a package can be read, tested and replaced from the bottom up."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        if name != "rlrunner":
            graph.setdefault(_package_of(name), set()).update(
                _package_of(target) for target in _imports(name, path) if target != "rlrunner")
    graph = {package: targets - {package} for package, targets in graph.items()}
    assert graph["rlrunner.sizing"] >= {"rlrunner.models"}  # the package graph sees imports
    assert _cycles(graph) == []


def test_tests_mirror_the_package():
    """tests/<package>/ holds the tests of rlrunner/<package>/; besides those, only project/ (docs, links, layout,
    environment, benches), helpers/ (modules the folders import) and fixtures/ (data); no test at the top."""
    tests = ROOT / "tests"
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - packages <= {"project", "helpers", "fixtures"}, folders - packages
    assert sorted(p.name for p in tests.glob("test_*.py")) == []
    assert sorted(p.name for p in (tests / "helpers").glob("test_*.py")) == []


#: Imports every module once, forgets rlrunner's modules (the libraries they pulled in stay loaded), then imports
#: each module in a fork of that process: a fresh rlrunner for every module, at the cost of a fork, not of torch.
IMPORT_EACH = r"""
import importlib, os, sys, traceback
names = sys.argv[1:]
for name in names:
    importlib.import_module(name)
packages = {name.split(".")[0] for name in names}
for loaded in [m for m in sys.modules if m.split(".")[0] in packages]:
    del sys.modules[loaded]
for name in names:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            print("failed", name, repr(traceback.format_exc()), flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 1:  # 1: the fork said why
        print("ok" if code == 0 else f"exited-{code}", name, flush=True)
"""


@pytest.fixture(scope="module")
def imported_alone() -> dict[str, str]:
    """Module -> "ok", or why it did not import in a process that had imported no other rlrunner module."""
    done = subprocess.run([sys.executable, "-c", IMPORT_EACH, *sorted(MODULES)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {}
    for line in done.stdout.splitlines():
        status, name, *why = line.split(" ", 2)
        results[name] = "ok" if status == "ok" else (why[0] if why else status)
    return results


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_imports_on_its_own(name, imported_alone):
    assert imported_alone.get(name) == "ok", imported_alone.get(name, "not reached")


def test_the_import_check_sees_a_module_that_needs_another_imported_first(tmp_path):
    """A module that works only after another one was imported (it reads ``toy.first`` without importing it) imports
    in one process after that one, and fails in the forked check."""
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "__init__.py").write_text("")
    (tmp_path / "toy" / "first.py").write_text("X = 1\n")
    (tmp_path / "toy" / "second.py").write_text("import toy\n\nY = toy.first.X\n")
    done = subprocess.run([sys.executable, "-c", IMPORT_EACH, "toy.first", "toy.second"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert [line.split(" ")[:2] for line in done.stdout.splitlines()] == [["ok", "toy.first"], ["failed", "toy.second"]]


def test_no_file_over_400_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these by idea: {long}"


def _layout_script():
    spec = importlib.util.spec_from_file_location("layout_script", ROOT / "scripts" / "layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_top_level_holds_packages_not_modules():
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in {"__init__.py", "__main__.py"})
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, f"group these into packages by what they hold: {modules}"


def test_each_package_imports_exactly_what_its_docstring_says():
    """A package's ``May import:`` line names the other packages it imports (lazily too); the root package itself
    (``import rlrunner``, to find its folder) counts for none."""
    layout = _layout_script()
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    wrong = []
    for folder in layout.packages():
        if folder == PACKAGE or folder.parent != PACKAGE:
            continue
        doc = layout.docstring(folder / "__init__.py")
        text, allowed = layout.split_may_import(doc)
        assert text, f"{folder.name}/__init__.py has no docstring saying what the package holds"
        assert allowed is not None, f"{folder.name}/__init__.py's docstring ends without a 'May import:' paragraph"
        prefix = f"rlrunner.{folder.name}"
        used = {".".join(target.split(".")[:2]) for name, targets in graph.items()
                if name == prefix or name.startswith(prefix + ".") for target in targets}
        used -= {prefix, "rlrunner"}
        if used != set(allowed):
            wrong.append(f"{folder.name}: imports {sorted(used)}, docstring says {sorted(allowed)}")
    assert not wrong, "\n".join(wrong)


def test_every_package_has_a_docstring():
    layout = _layout_script()
    assert [f for f in layout.packages() if not layout.docstring(f / "__init__.py")] == []


def test_the_layout_doc_is_current():
    layout = _layout_script()
    assert layout.LAYOUT_DOC.read_text() == layout.render(), "run: bin/rlrunner python scripts/layout.py --write"


def test_may_import_parsing():
    layout = _layout_script()
    assert layout.split_may_import("Holds x.\n\nMay import: rlrunner.config,\nrlrunner.utils") == \
        ("Holds x.", ("rlrunner.config", "rlrunner.utils"))
    assert layout.split_may_import("Holds x.\n\nMay import: nothing of rlrunner") == ("Holds x.", ())
    assert layout.split_may_import("Holds x.") == ("Holds x.", None)

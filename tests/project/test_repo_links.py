"""The repository stands alone: no file points to a path outside it (a sibling checkout, notes kept elsewhere) and
every relative Markdown link resolves to a file in it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a path into a folder beside the checkout, or a notes file by name: neither ships with a clone
OUTSIDE = re.compile(r"(?<![\w.-])shared/|\b[A-Z]+\.md\b")
PARENT_PATH = re.compile(r"(?<![\w./-])((?:\.\./)+[\w][\w./-]*)")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def repo_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    files = []
    for name in listed:
        path = ROOT / name
        if path.is_file() and path != Path(__file__).resolve():
            try:
                files.append((path, path.read_text()))
            except UnicodeDecodeError:  # images, weights
                continue
    return files


def inside(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


def test_no_file_points_outside_the_repository():
    bad, files = [], repo_text_files()
    names = {path.name for path, _ in files}
    for path, text in files:
        for match in OUTSIDE.finditer(text):
            name = match.group(0)
            # an upper-case Markdown name is fine when the repo has that file (README.md, SOURCE.md, ...)
            if name.endswith(".md") and name in names:
                continue
            bad.append(f"{path.relative_to(ROOT)}: {name}")
        for match in PARENT_PATH.finditer(text):
            if not inside(path.parent / match.group(1)):
                bad.append(f"{path.relative_to(ROOT)}: {match.group(1)}")
    assert not bad, "paths outside the repository (move what they point to into docs/):\n" + "\n".join(bad)


def test_relative_markdown_links_resolve_inside_the_repository():
    bad = []
    for path, text in repo_text_files():
        if path.suffix != ".md":
            continue
        for target in MARKDOWN_LINK.findall(text):
            if re.match(r"[a-z]+:|#", target):  # web links and anchors
                continue
            file = path.parent / target.split("#")[0]
            if not (inside(file) and file.exists()):
                bad.append(f"{path.relative_to(ROOT)}: {target}")
    assert not bad, "broken or outside links:\n" + "\n".join(bad)


PACKAGE_PATH = re.compile(r"(?<![\w/.-])rlrunner/[\w/]+(?:\.py|/)")
PACKAGE_MODULE = re.compile(r"(?<![\w.])rlrunner(?:\.[a-z_][a-z0-9_]*)+")


def _module_exists(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of rlrunner, or a name defined in one
    (``rlrunner.models.base.FlowModel``, ``rlrunner.__file__``)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            rest = parts[end:]
            return not rest or rest[0].startswith("__") or re.search(rf"\b{rest[0]}\b", source.read_text()) is not None
    return False


def test_every_named_package_path_and_module_exists():
    """A file list or a citation that outlived a move (``rlrunner/runner.py``, ``rlrunner.train``) fails here."""
    bad = []
    for path, text in repo_text_files():
        for match in PACKAGE_PATH.finditer(text):
            if not (ROOT / match.group(0)).exists():
                bad.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
        for match in PACKAGE_MODULE.finditer(text):
            name = match.group(0).rstrip(".")
            if not _module_exists(name):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, "names of rlrunner's files or modules that do not exist:\n" + "\n".join(sorted(set(bad)))

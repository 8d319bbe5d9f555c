"""The layout of ``rlrunner/`` as Markdown, generated from the package and module docstrings: every package with what
it holds and what it may import, every module with the first paragraph of its docstring.

    bin/rlrunner python scripts/layout.py            # print it
    bin/rlrunner python scripts/layout.py --write    # write docs/layout.md (tests/project/test_package_layout.py checks it)
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlrunner"
LAYOUT_DOC = ROOT / "docs" / "layout.md"
MAY_IMPORT = re.compile(r"^May import: (.+?)\s*\Z", re.DOTALL | re.MULTILINE)
NOTHING = "nothing of rlrunner"


def docstring(path: Path) -> str:
    """The module docstring of ``path`` ("" where it has none)."""
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def split_may_import(doc: str) -> tuple[str, tuple[str, ...] | None]:
    """A package docstring's text before its closing ``May import:`` paragraph, and the packages that paragraph
    names (``()`` for "nothing of rlrunner", ``None`` where the paragraph is missing)."""
    match = MAY_IMPORT.search(doc)
    if not match:
        return doc.strip(), None
    names = " ".join(match.group(1).split())
    allowed = () if names == NOTHING else tuple(n.strip() for n in names.split(","))
    return doc[:match.start()].strip(), allowed


def packages() -> list[Path]:
    """Every package folder under ``rlrunner/`` (the root first), sorted by path."""
    return sorted((p.parent for p in PACKAGE.rglob("__init__.py")), key=lambda p: (p != PACKAGE, str(p)))


def first_paragraph(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split())


def cell(text: str) -> str:
    """``text`` as one Markdown table cell."""
    return text.replace("|", r"\|")


def render() -> str:
    lines = ["# Layout of `rlrunner/`", "",
             ("Generated from the package and module docstrings by `bin/rlrunner python scripts/layout.py --write`; "
              "`tests/project/test_package_layout.py` fails when it is stale and holds each package to its \"May import\" "
              "line."), ""]
    for folder in packages():
        rel = folder.relative_to(ROOT).as_posix()
        text, allowed = split_may_import(docstring(folder / "__init__.py"))
        lines += [f"## `{rel}/`", "", text, ""]
        if allowed is not None:
            lines += [f"May import: {', '.join(f'`{a}`' for a in allowed) or NOTHING}.", ""]
        modules = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
        if modules:
            lines += ["| module | what it holds |", "| --- | --- |"]
            lines += [f"| `{p.name}` | {cell(first_paragraph(docstring(p)))} |" for p in modules]
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {LAYOUT_DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if args.write:
        LAYOUT_DOC.write_text(render())
        print(f"wrote {LAYOUT_DOC.relative_to(ROOT)}")
    else:
        sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

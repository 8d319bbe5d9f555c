"""Reading the docs as the docs tests see them: the pages (README.md and docs/**/*.md, whatever exists when the tests
run), their fenced blocks, their headings and the anchors GitHub gives those headings."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^ {0,3}(?P<fence>```+|~~~+)\s*(?P<info>[\w+-]*)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def doc_pages() -> list[Path]:
    """The pages of the docs site: the README (its home page) and every Markdown file under docs/."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def tracked_files() -> list[Path]:
    """The repository's files as a clone has them (tracked, or new and not ignored)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced block: its page, the line number of its first content line, its info string and its lines."""

    path: Path
    line: int
    info: str
    lines: tuple[str, ...]

    def where(self, offset: int = 0) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line + offset}"


def split_fences(text: str) -> tuple[list[Block], list[tuple[int, str]]]:
    """``(fenced blocks, (line number, line) of the prose outside them)`` of a Markdown text."""
    blocks, prose, opened, body = [], [], None, []
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if opened is None and match:
            opened, body = (number + 1, match["info"], match["fence"]), []
        elif opened is not None and line.strip().startswith(opened[2]) and not line.strip().strip(opened[2][0]):
            blocks.append((opened[0], opened[1], tuple(body)))
            opened = None
        elif opened is not None:
            body.append(line)
        else:
            prose.append((number, line))
    return blocks, prose


@cache
def _read(path: Path) -> tuple[list[Block], list[tuple[int, str]]]:
    raw, prose = split_fences(path.read_text())
    return [Block(path, line, info, lines) for line, info, lines in raw], prose


def fenced_blocks(path: Path) -> list[Block]:
    return _read(path)[0]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    return _read(path)[1]


def github_slug(title: str) -> str:
    """The anchor GitHub (and mkdocs.yml's pymdownx slugify) gives a heading: its text without Markdown, lower case,
    every character but letters, digits, ``_``, ``-`` and spaces dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file: its headings' slugs (a repeated one gets ``-1``, ``-2``, ... as on GitHub)
    and explicit ``<a name=...>`` / ``<a id=...>``."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if match:
            slug = github_slug(match[2])
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
        found.update(HTML_ANCHOR.findall(line))
    return found


def commands(block: Block, starts: tuple[str, ...]) -> list[tuple[int, int, str]]:
    """``(first line, line after it, command)`` (offsets into ``block.lines``) of each command line of ``block`` that
    starts with one of ``starts`` (a leading ``$ `` prompt dropped), its ``\\`` continuation lines joined."""
    found, index = [], 0
    while index < len(block.lines):
        line = block.lines[index].strip().removeprefix("$ ")
        first = index
        while line.endswith("\\") and index + 1 < len(block.lines):
            index += 1
            line = line[:-1].rstrip() + " " + block.lines[index].strip()
        index += 1
        if line.startswith(starts):
            found.append((first, index, line))
    return found

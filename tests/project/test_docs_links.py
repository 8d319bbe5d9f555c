"""Links between the docs pages land on a heading that exists, and every place in the code, tests or docs that cites a
section of the README or of a docs page by its title still finds it (tests/project/test_repo_links.py checks that linked
files exist)."""

from __future__ import annotations

import re
from pathlib import Path

from docs_helpers import ROOT, anchors, doc_pages, github_slug, prose_lines, tracked_files

MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`]*`")
# README "Title", README \"Title\" (in a Python string), docs/<page>.md, "Title" and docs/<page>.md "Title"
# (a citation may wrap onto the next line: the title is read with its whitespace collapsed)
CITATION = re.compile(r"(README(?:\.md)?|docs/[\w/]+\.md),?\s+\\?\"([^\"\\]+)\\?\"")


def broken_anchors(page: Path, root: Path = ROOT) -> list[str]:
    """``page``'s links with an anchor (``#part``, ``other.md#part``) whose target file has no such heading."""
    bad = []
    for number, line in prose_lines(page):
        for target in MARKDOWN_LINK.findall(CODE_SPAN.sub("", line)):
            path, hash_, anchor = target.partition("#")
            if not hash_ or re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue
            file = (page.parent / path).resolve() if path else page
            if file.suffix == ".md" and file.is_file() and anchor not in anchors(file):
                bad.append(f"{page.relative_to(root)}:{number}: {target}")
    return bad


def test_links_to_a_heading_find_it_in_every_page():
    bad = [item for page in doc_pages() for item in broken_anchors(page)]
    assert not bad, "links to headings that do not exist (GitHub's anchor of the heading, e.g. #will-it-fit):\n" + \
        "\n".join(bad)


def test_the_anchor_check_sees_a_dead_anchor(tmp_path):
    # the check above must fail on a link naming a heading that is gone, and pass the ones that exist
    (tmp_path / "other.md").write_text("# Other\n\n## Will it fit?\n\n```bash\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Will it fit?\n\nSee [here](other.md#will-it-fit), [up](#page), "
                    "[gone](other.md#not-a-heading), [twice](#will-it-fit-1), [not one](other.md#not-a-heading-1), "
                    "`[code](#nothing)`.\n")
    assert broken_anchors(page, tmp_path) == ["page.md:5: other.md#not-a-heading", "page.md:5: #will-it-fit-1",
                                              "page.md:5: other.md#not-a-heading-1"]


def test_github_slugs_of_headings():
    assert github_slug("Will it fit?") == "will-it-fit"
    assert github_slug("Coming from RLinf") == "coming-from-rlinf"
    assert github_slug("`bin/rlrunner plan`: what fits") == "binrlrunner-plan-what-fits"
    assert github_slug("Preemption and recovery") == "preemption-and-recovery"
    assert github_slug("A / B") == "a--b"  # GitHub keeps both hyphens


def citations() -> list[tuple[str, str, str]]:
    """``(where, cited file, cited title)`` of every section citation in the repository's text files."""
    found = []
    for path in tracked_files():
        if path.suffix not in (".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", "") or path == Path(__file__):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for match in CITATION.finditer(text):
            cited = "README.md" if match[1].startswith("README") else match[1]
            # a README elsewhere (rlrunner/rewards/geneval/README.md) is cited as "README.md here", not so
            number = text.count("\n", 0, match.start()) + 1
            found.append((f"{path.relative_to(ROOT)}:{number}", cited, " ".join(match[2].split())))
    return found


def test_every_cited_section_exists():
    """A section that moved or was renamed (README's sections moving into docs/ pages) leaves its citations behind:
    each must name a heading of the file it cites."""
    found = citations()
    assert len(found) > 10, "the citation pattern finds nothing: has the way sections are cited changed?"
    bad = [f"{where}: {cited} \"{title}\"" for where, cited, title in found
           if not (ROOT / cited).is_file() or github_slug(title) not in anchors(ROOT / cited)]
    assert not bad, "citations of sections that do not exist (cite the page and heading where it lives now):\n" + \
        "\n".join(bad)


DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w/.-]*\w\.(?:md|py|png)\b")


def test_every_named_docs_page_exists():
    """A docs page named in code, tests or docs (``docs/design.md``) that was moved or renamed fails here."""
    bad = []
    for path in tracked_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        bad += [f"{path.relative_to(ROOT)}: {name}" for name in DOCS_PATH.findall(text) if not (ROOT / name).is_file()]
    assert not bad, "docs pages that do not exist:\n" + "\n".join(sorted(set(bad)))

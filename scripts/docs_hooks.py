"""mkdocs hooks of the docs site (mkdocs.yml ``hooks:``): the pages stay plain Markdown that reads the same on GitHub.

- README.md is the site's home page (``index.md``) unless docs/ has an index.md.
- A relative link is written as it works on GitHub, from the file's real place in the repository: on the home page
  ``docs/layout.md`` becomes ``layout.md``; a link from docs/ to ``../README.md`` goes to the home page; a
  link to a file outside docs/ (``../rlrunner/recipe.py``, ``LICENSE``) goes to ``repo_url``'s ``blob/main/`` page
  when mkdocs.yml sets one, else it becomes its text and the path (the site holds no copy of the file).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# [text](target) and ![alt](target), the target relative (no scheme, not an anchor, not a site-absolute path)
LINK = re.compile(r"(?P<image>!?)\[(?P<text>[^\]]*)\]\((?P<target>(?![a-z][a-z0-9+.-]*:|#|/)[^)\s]+)\)")
FENCE = re.compile(r"^ {0,3}(```|~~~)")


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    if files.get_file_from_path("index.md") is None:
        files.append(File.generated(config, "index.md", abs_src_path=str(README)))
    return files


def _rewrite(match: re.Match, real_dir: Path, site_dir: Path, docs_dir: Path, repo_url: str) -> str:
    target = match["target"]
    path, _, anchor = target.partition("#")
    real = (real_dir / path).resolve()
    if real == README and not (docs_dir / "index.md").exists():
        real = docs_dir / "index.md"
    if real.is_relative_to(docs_dir):
        new = os.path.relpath(real, site_dir) + (f"#{anchor}" if anchor else "")
        return f"{match['image']}[{match['text']}]({new})"
    if not real.is_relative_to(ROOT):
        return match[0]  # outside the repository: mkdocs reports it
    in_repo = real.relative_to(ROOT).as_posix()
    if repo_url:
        return f"{match['image']}[{match['text']}]({repo_url.rstrip('/')}/blob/main/{in_repo})"
    text = match["text"]
    return text if text.strip("`") in (in_repo, real.name) else f"{text} (`{in_repo}`)"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    real_dir = Path(page.file.abs_src_path).resolve().parent
    site_dir = (docs_dir / page.file.src_uri).parent
    repo_url = config.get("repo_url") or ""
    lines, fenced = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            line = LINK.sub(lambda match: _rewrite(match, real_dir, site_dir, docs_dir, repo_url), line)
        lines.append(line)
    return "\n".join(lines)

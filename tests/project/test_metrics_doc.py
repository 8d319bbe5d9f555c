"""docs/metrics.md lists every tag a run logs, for every algorithm, and no tag a run of that algorithm lacks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from runner_helpers import read_metrics, small_recipe
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlrunner.objectives import OBJECTIVES
from rlrunner.run.runner import run

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented(algorithm: str) -> tuple[set[str], set[str]]:
    """Tags (as regular expressions) the doc's tables say a run of ``algorithm`` logs: always, and only with some
    setting. A table row is ``| `tag`, `tag` | logged | meaning ... |``."""
    always, optional = set(), set()
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        tags, logged = re.findall(r"`([^`]+)`", cells[0]), cells[1]
        if "every run" not in logged and f"`{algorithm}`" not in logged:
            continue
        patterns = {re.escape(t).replace(re.escape("<part>"), "[a-z0-9_]+") for t in tags}
        (optional if "only" in logged else always).update(patterns)
    return always, optional


def logged_tags(log_dir: Path) -> set[str]:
    scalars = {key for record in read_metrics(log_dir) for key in record} - {"step"}
    events = EventAccumulator(str(log_dir / "tensorboard"), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    texts = {t.removesuffix("/text_summary") for t in events.Tags()["tensors"]}
    return scalars | set(events.Tags()["images"]) | texts


@pytest.mark.parametrize("algorithm", sorted(OBJECTIVES))
def test_metrics_doc_matches_a_two_step_run(algorithm, tmp_path):
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    run(small_recipe(tmp_path, f"algorithm.name={algorithm}", "runner.max_steps=2", "runner.save_interval=0"),
        log_dir)
    tags = logged_tags(log_dir)
    always, optional = documented(algorithm)
    undocumented = {t for t in tags if not any(re.fullmatch(p, t) for p in always | optional)}
    missing = {p for p in always if not any(re.fullmatch(p, t) for t in tags)}
    # the run sets none of the settings that "only ..." rows name, so those tags must be absent
    unexpected = {t for t in tags if any(re.fullmatch(p, t) for p in optional)}
    assert not undocumented, f"logged by {algorithm} but not in docs/metrics.md: {sorted(undocumented)}"
    assert not missing, f"docs/metrics.md says every {algorithm} run logs these, but it did not: {sorted(missing)}"
    assert not unexpected, f"docs/metrics.md says these need a setting this run lacks: {sorted(unexpected)}"

"""The one checkpoint index: each runner.resume_dir form (a checkpoint folder, a run folder, auto) takes the
checkpoint its documented rule names (rlrunner/run/checkpoint_index.py), and so do in-run restart and export."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from rlrunner.commands.export import main as export_main
from rlrunner.run.checkpoint import ACTOR_FILE, MANIFEST, RUNNER_FILE, CheckpointError, save_checkpoint
from rlrunner.run.checkpoint_index import CheckpointIndex, find_checkpoint, restart_point
from rlrunner.run.checkpointer import check_rollout_groups


def _save(run_dir: Path, step: int, experiment: str = "exp") -> Path:
    """A complete checkpoint of experiment ``experiment`` in the run folder ``run_dir``."""
    def adapters(folder: Path) -> None:
        (folder / "adapter").mkdir()
        torch.save({}, folder / "adapter" / "weights.pt")

    return save_checkpoint(run_dir / "checkpoints", step, runner_state={"step": step}, actor_state={"adapters": {}},
                           config_yaml=f"runner:\n  logger:\n    experiment_name: {experiment}\n",
                           model_info={"model_type": "tiny"}, write_adapters=adapters)


def _half_written(run_dir: Path, step: int) -> None:
    """What a crash mid-save leaves: a .tmp folder, and a global_step_N whose manifest never got written."""
    for name in (f"global_step_{step}.tmp", f"global_step_{step + 1}"):
        (run_dir / "checkpoints" / name).mkdir(parents=True)
        (run_dir / "checkpoints" / name / RUNNER_FILE).write_bytes(b"partial")


def _break(ckpt: Path) -> Path:
    (ckpt / ACTOR_FILE).write_bytes(b"")  # a file whose data never reached the disk
    return ckpt


def test_a_checkpoint_folder_is_taken_as_given_and_one_that_does_not_read_back_is_an_error(tmp_path):
    run_dir = tmp_path / "20260101-000000-exp"
    named, _newer = _save(run_dir, 1), _save(run_dir, 2)
    assert find_checkpoint(str(named), tmp_path, "exp") == named  # never swapped for the newer one
    _break(named)
    with pytest.raises(CheckpointError, match=rf"^checkpoint file {named / ACTOR_FILE} has 0 bytes, its manifest"):
        find_checkpoint(str(named), tmp_path, "exp")
    with pytest.raises(CheckpointError, match=r"^runner.resume_dir='.*global_step_9' does not exist$"):
        find_checkpoint(str(run_dir / "checkpoints" / "global_step_9"), tmp_path, "exp")


def test_a_run_folder_gives_its_newest_checkpoint_that_reads_back(tmp_path, caplog):
    run_dir = tmp_path / "20260101-000000-exp"
    good = _save(run_dir, 1)
    broken = _break(_save(run_dir, 2))
    _half_written(run_dir, 3)  # newer still, but never complete: not listed, so nothing to warn about
    for given in (run_dir, run_dir / "checkpoints"):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert find_checkpoint(str(given), tmp_path, "exp") == good
        assert [r.getMessage().split(":")[0] for r in caplog.records] == [f"skipping checkpoint {broken}"]
    _break(good)
    with pytest.raises(CheckpointError, match=r"^runner.resume_dir='.*-exp': none of its 2 checkpoint\(s\) loads "
                                              r"\(global_step_2: .*0 bytes.*; global_step_1: .*0 bytes"):
        find_checkpoint(str(run_dir), tmp_path, "exp")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"^runner.resume_dir='.*empty' holds no complete checkpoint"):
        find_checkpoint(str(tmp_path / "empty"), tmp_path, "exp")


def test_auto_gives_the_last_written_checkpoint_of_its_experiment_across_runs(tmp_path, caplog):
    first, second = tmp_path / "20260101-000000-exp", tmp_path / "20260101-000001-exp"
    assert find_checkpoint("auto", tmp_path, "exp") is None  # nothing yet: the run starts from scratch
    _save(first, 100)
    resumed = _save(second, 60)  # a later run that went back to step 60: last written, so newest
    _save(tmp_path / "20260101-000002-other", 7, experiment="other")  # another experiment's, newer still
    broken = _break(_save(first, 101))
    _half_written(second, 61)
    with caplog.at_level(logging.WARNING):
        assert find_checkpoint("auto", tmp_path, "exp") == resumed
    assert f"skipping checkpoint {broken}: checkpoint file {broken / ACTOR_FILE} has 0 bytes" in caplog.text
    assert CheckpointIndex.of_experiment(tmp_path, "exp").newest() == broken  # listed, never resumed from
    assert find_checkpoint("auto", tmp_path, "nobody") is None


def test_a_restart_takes_its_own_newest_checkpoint_that_reads_back_else_where_the_run_started(tmp_path, caplog):
    run_dir = tmp_path / "20260101-000000-exp"
    assert restart_point(run_dir, "auto") == "auto"  # no checkpoint of its own yet
    own = _save(run_dir, 1)
    broken = _break(_save(run_dir, 2))
    with caplog.at_level(logging.WARNING):
        assert restart_point(run_dir, "auto") == str(own)
    assert f"skipping checkpoint {broken}" in caplog.text
    _break(own)
    assert restart_point(run_dir, "/elsewhere/global_step_5") == "/elsewhere/global_step_5"


def test_export_refuses_a_named_checkpoint_that_does_not_read_back_in_one_line(tmp_path, capsys):
    ckpt = _break(_save(tmp_path / "20260101-000000-exp", 1))
    assert export_main([str(ckpt), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlrunner: error: checkpoint file {ckpt / ACTOR_FILE} has 0 bytes, its manifest says ")
    assert err.count("\n") == 1  # one line, no traceback
    assert not (tmp_path / "out").exists()
    (ckpt / MANIFEST).unlink()
    assert export_main([str(ckpt), "--out", str(tmp_path / "out")]) == 2
    assert f"{ckpt} is not a complete checkpoint: {MANIFEST} is missing" in capsys.readouterr().err


def test_rollout_noise_is_compared_by_rollout_groups_not_ranks(tmp_path):
    """Rollout noise is seeded per rollout group (ranks / rollout.context_parallel_size)."""
    ckpt = tmp_path / "global_step_1"
    check_rollout_groups(ckpt, (2, 2), (1, 1))  # one group of 2 ranks draws what one rank draws
    check_rollout_groups(ckpt, (4, 2), (2, 1))
    with pytest.raises(CheckpointError) as err:  # the same 4 ranks in 2 groups instead of 4: other noise
        check_rollout_groups(ckpt, (4, 1), (4, 2))
    assert str(err.value) == (
        f"checkpoint {ckpt} was rolled out by 4 rollout rank(s) (rollout.context_parallel_size=1: 4 group(s)), this "
        "placement has 4 (rollout.context_parallel_size=2: 2 group(s)): rollout noise is drawn per rollout group, so "
        "the run would not go on as it would have; place 4 rollout group(s) (cluster.component_placement, "
        "rollout.context_parallel_size), or accept another continuation with "
        "runner.resume_allow_changes=[cluster.component_placement]")
    with pytest.raises(CheckpointError, match=r"rolled out by 2 rollout rank\(s\), this placement has 1: rollout "
                                              r"noise is drawn per rollout rank, .*; place 2 rollout rank\(s\) "
                                              r"\(cluster.component_placement\), or accept"):
        check_rollout_groups(ckpt, (2, 1), (1, 1))

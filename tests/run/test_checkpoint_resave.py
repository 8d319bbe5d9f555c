"""Re-saving a step keeps the old checkpoint until the new one is in place: a SIGKILL between setting the old aside
and renaming the new in loses nothing, and resume resolution finds the set-aside copy. Checkpoints from before
recipe paths were made absolute still resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlrunner.run.checkpoint import (
    CheckpointError,
    complete_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rlrunner.run.checkpoint_index import find_checkpoint

ROOT = Path(__file__).resolve().parents[2]
# saves step 2 twice in the run folder argv[1]; the re-save is killed right before the new copy is renamed in
RESAVE_KILLED = """
import os, signal, sys
from pathlib import Path
from rlrunner.run.checkpoint import save_checkpoint

root = Path(sys.argv[1]) / "checkpoints"

def save(marker):
    save_checkpoint(root, 2, runner_state={"marker": marker}, actor_state={"adapters": {"default": {}, "ema": {}}},
                    config_yaml="", model_info={"model_type": "tiny"},
                    write_adapters=lambda d: (d / "adapter").mkdir())

save("first")
rename = Path.rename
def rename_or_die(self, target):
    if self.name.endswith(".tmp"):  # the old checkpoint is already set aside
        os.kill(os.getpid(), signal.SIGKILL)
    return rename(self, target)
Path.rename = rename_or_die
save("second")
"""


def _save(root: Path, marker: str) -> Path:
    return save_checkpoint(root, 2, runner_state={"marker": marker}, actor_state={"adapters": {"default": {},
                                                                                                "ema": {}}},
                           config_yaml="", model_info={"model_type": "tiny"}, write_adapters=lambda d: None)


def test_a_kill_between_the_two_renames_of_a_resave_loses_nothing(tmp_path):
    run_dir = tmp_path / "20260101-000000-resave"
    proc = subprocess.run([sys.executable, "-c", RESAVE_KILLED, str(run_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["global_step_2.old", "global_step_2.tmp"]
    aside = checkpoints / "global_step_2.old"
    assert complete_checkpoints(checkpoints) == [aside]
    for given in (str(checkpoints / "global_step_2"), str(run_dir), "auto"):
        assert find_checkpoint(given, tmp_path, "resave") == aside, given
    ckpt = load_checkpoint(aside, {"model_type": "tiny"}, actor_world_size=1)
    assert ckpt["runner"]["marker"] == "first" and (aside / "adapter").is_dir()
    # the next save of the step puts a complete global_step_2 in place and leaves nothing else behind
    final = _save(checkpoints, "third")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["global_step_2"]
    assert torch.load(final / "runner.pt", weights_only=False)["marker"] == "third"
    assert json.loads((final / "manifest.json").read_text())["global_step"] == 2


def test_a_resave_replaces_the_old_checkpoint(tmp_path):
    _save(tmp_path, "first")
    final = _save(tmp_path, "second")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2"]
    assert complete_checkpoints(tmp_path) == [final]
    assert torch.load(final / "runner.pt", weights_only=False)["marker"] == "second"


def test_a_checkpoint_with_a_relative_model_path_resumes_from_the_folder_it_was_run_in(tmp_path, monkeypatch):
    """Checkpoints written before recipe paths were made absolute hold model_path as the recipe gave it."""
    (tmp_path / "model").mkdir()
    ckpt = save_checkpoint(tmp_path / "checkpoints", 1, runner_state={}, actor_state={"adapters": {"ema": {}}},
                           config_yaml="", model_info={"model_path": "model"}, write_adapters=lambda d: None)
    monkeypatch.chdir(tmp_path)
    assert load_checkpoint(ckpt, {"model_path": str(tmp_path / "model")}, actor_world_size=1)["manifest"]
    with pytest.raises(CheckpointError, match="model_path='model', this recipe has model_path="):
        load_checkpoint(ckpt, {"model_path": str(tmp_path / "other")}, actor_world_size=1)

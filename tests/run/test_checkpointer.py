"""The checkpointer's resume rules, one table (rlrunner.run.checkpointer.RESUME_RULES): every key it frees is a key of
the recipe, and each rule's check refuses with one line unless runner.resume_allow_changes waives it."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from runner_helpers import small_recipe

from rlrunner.run.checkpoint import CheckpointError
from rlrunner.run.checkpointer import RESUME_RULES, check_resume_state

NOW = {"lr_schedule_steps": 20, "lr_scheduler": "cosine", "rollout_world_size": 1, "rollout_cp": 1}


def _flat_keys(node: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in node.items():
        keys.add(f"{prefix}{key}")
        if isinstance(value, dict):
            keys |= _flat_keys(value, f"{prefix}{key}.")
    return keys


def test_every_key_a_resume_may_change_is_a_key_or_section_of_the_recipe(tmp_path):
    recipe = _flat_keys(OmegaConf.to_container(small_recipe(tmp_path), resolve=True))
    for rule in RESUME_RULES:
        for key in rule.keys:
            assert key.rstrip(".") in recipe, f"RESUME_RULES names {key!r}, which the recipe does not have"
        assert not rule.waived_by or rule.waived_by.startswith(rule.keys), rule  # it waives a key of its own


def test_a_longer_lr_schedule_is_refused_unless_waived_or_length_free():
    saved = {"lr_schedule_steps": 10}  # no rollout_world_size: a checkpoint older than the rollout-group rule
    with pytest.raises(CheckpointError, match=r"^checkpoint ckpt was trained on a cosine LR schedule 10 optimizer "
                                              r"steps long; this recipe's run length makes it 20, .*"
                                              r"runner.resume_allow_changes=\[runner.max_steps\]$"):
        check_resume_state(Path("ckpt"), saved, NOW, None)
    check_resume_state(Path("ckpt"), saved, NOW, ["runner.max_steps"])
    check_resume_state(Path("ckpt"), saved, NOW, True)
    check_resume_state(Path("ckpt"), saved, {**NOW, "lr_scheduler": "constant"}, None)
    check_resume_state(Path("ckpt"), {"lr_schedule_steps": 20}, NOW, None)


def test_other_rollout_groups_are_refused_unless_the_placement_change_is_accepted(tmp_path):
    ckpt = tmp_path / "global_step_3"
    ckpt.mkdir()
    (ckpt / "config.yaml").write_text("rollout:\n  context_parallel_size: 1\n")
    saved = {"lr_schedule_steps": 20, "rollout_world_size": 2}
    with pytest.raises(CheckpointError, match=r"was rolled out by 2 rollout rank\(s\), this placement has 1: "):
        check_resume_state(ckpt, saved, NOW, ["runner.max_steps"])
    check_resume_state(ckpt, saved, NOW, ["cluster.component_placement"])
    check_resume_state(ckpt, saved, {**NOW, "rollout_world_size": 2}, None)

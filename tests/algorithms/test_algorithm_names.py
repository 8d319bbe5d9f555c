"""Every ``algorithm.name`` of the registry runs the CPU recipe through the launcher, as a user would switch it."""

from __future__ import annotations

import json
import math

import pytest

from rlrunner.objectives import OBJECTIVES, objective_class
from rlrunner.recipe import load_recipe
from tests.commands.test_launcher import launch


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_each_algorithm_trains_two_steps_of_the_cpu_recipe(tmp_path, name):
    result = launch(f"algorithm.name={name}", "runner.max_steps=2", "env.train.total_num_envs=16",
                    "actor.global_batch_size=16", "env.eval.total_num_envs=8", "runner.val_check_interval=2",
                    "runner.sample_log_interval=0", log_root=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "env/avg" in r]
    assert [r["step"] for r in train] == [1, 2]
    cfg = load_recipe("tiny_nft_ocr", [f"algorithm.name={name}"])
    loss_key = f"train/actor/{objective_class(cfg.algorithm.name).loss_key}"
    for record in train:
        assert math.isfinite(record[loss_key]) and record["train/actor/nonfinite"] == 0.0
        assert record["train/actor/grad_norm"] > 0  # the loss reaches the trained adapter
    assert (run_dir / "checkpoints" / "global_step_2" / "adapter" / "pytorch_lora_weights.safetensors").is_file()

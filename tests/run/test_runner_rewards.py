"""The CPU multi-reward recipe (tiny_nft_pickscore_clipscore: PickScore + CLIPScore of a tiny random CLIP scorer,
GDPO-style per-reward normalisation) trains 2 steps end to end, with its advantages from the per-reward normalisation.
"""

from __future__ import annotations

import numpy as np
import pytest
from runner_helpers import make_assets, train_metrics

import rlrunner.run.runner as runner_module
from rlrunner.recipe import load_recipe
from rlrunner.run.runner import run

pytestmark = pytest.mark.slow
SMALL = ["actor.model.tiny.resolution=[16,32]", "actor.model.tiny.num_steps=2", "actor.model.tiny.lora_rank=4",
         "actor.model.tiny.lora_alpha=4", "algorithm.group_size=4", "env.train.total_num_envs=8",
         "env.eval.total_num_envs=4", "actor.micro_batch_size=4", "actor.global_batch_size=8",
         "runner.max_steps=2", "runner.val_check_interval=0", "runner.val_before_train=false",
         "runner.sample_log_interval=0"]


def test_tiny_clip_recipe_trains_on_gdpo_advantages(tmp_path, monkeypatch):
    model, data = make_assets(tmp_path)
    calls = []
    gdpo = runner_module.per_reward_normalized_advantages

    def recording(parts, weights, group_size, **kwargs):
        advantages = gdpo(parts, weights, group_size, **kwargs)
        calls.append((parts.shape, weights[0].tolist(), group_size, advantages))
        return advantages

    monkeypatch.setattr(runner_module, "per_reward_normalized_advantages", recording)
    paths = [f"actor.model.model_path={model}", f"env.train.dataset.path={data}", f"env.eval.dataset.path={data}",
             f"runner.logger.log_path={tmp_path}"]
    cfg = load_recipe("tiny_nft_pickscore_clipscore", [*SMALL, *paths])
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    run(cfg, log_dir)
    metrics = train_metrics(log_dir)
    assert len(metrics) == 2
    assert all(np.isfinite(m["env/pickscore"]) and np.isfinite(m["env/clipscore"]) for m in metrics)
    assert [c[:3] for c in calls] == [((8, 2), [1.0, 1.0], 4)] * 2
    assert all(float(c[3].abs().max()) > 0 for c in calls)  # the random scorer still separates the samples

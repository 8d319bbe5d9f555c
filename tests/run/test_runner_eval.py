"""Held-out evaluation: every prompt scored exactly once whatever the number of rollout workers, and eval video
saving reads ``env.eval.video_cfg``; plus one training step of a video family (per-chunk advantages)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from runner_helpers import make_assets, small_recipe, train_metrics

from rlrunner.cluster import create_cluster
from rlrunner.run.runner import Runner
from rlrunner.step.shares import split_evenly
from rlrunner.tracking.logger import StepTimer


def test_split_shares_unevenly_and_drops_nothing():
    assert split_evenly(list(range(10)), 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert split_evenly(list(range(8)), 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert split_evenly([1, 2], 3) == [[1], [2], []]


def test_ten_eval_prompts_on_three_rollout_workers_are_each_scored_once(tmp_path):
    make_assets(tmp_path)
    prompts = [f'a label that reads "{n}"' for n in range(1000, 1010)]
    (tmp_path / "data" / "test.txt").write_text("".join(p + "\n" for p in prompts))
    cfg = small_recipe(tmp_path, "env.eval.total_num_envs=10", "runner.num_logged_samples=10",
                       "env.train.total_num_envs=12", "cluster.num_devices_per_node=4",
                       "cluster.component_placement={'actor,env': 0, rollout: 1-3}")
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    with create_cluster(cfg.cluster) as cluster:
        runner = Runner(cfg, log_dir, cluster)
        try:
            assert runner.rollout.world_size == 3
            rows = list(range(len(runner.eval_prompts)))  # every held-out prompt, by its row
            rollout, reward = runner.rollout_and_score(rows, 1, "eval", StepTimer(), step=0)
        finally:
            runner.close()
    assert rollout.num_samples == 10 and reward.avg.shape == (10,)
    assert rollout.logged.meta["prompts"] == prompts  # each held-out prompt once, in order
    # the reward of each logged image is the one computed for that image (jpeg compressibility of its pixels)
    from rlrunner.rewards import build_reward

    rescored = build_reward(cfg.env.eval.reward)(rollout.logged.tensors["images"].numpy(), prompts)
    np.testing.assert_allclose(reward.avg, rescored.avg, rtol=1e-6)


def _video_recipe(root: Path, *overrides: str):
    from tiny_pipelines import write_tiny_wan

    if not (root / "wan").exists():
        write_tiny_wan(root / "wan")
    family = "actor.model.wan22_ti2v_5b"
    return small_recipe(
        root, "actor.model.model_type=wan22_ti2v_5b", f"actor.model.model_path={root / 'wan'}",
        f"{family}.resolution=32", f"{family}.num_frames=5", f"{family}.max_sequence_length=8", f"{family}.num_steps=2",
        f"{family}.eval_num_steps=2", f"{family}.lora_rank=4", f"{family}.lora_alpha=4", "actor.model.precision=fp32",
        "algorithm.adv_type=grpo_video", "algorithm.advantage_mode=video", "env.eval.total_num_envs=2",
        "runner.num_logged_samples=2", *overrides)


@pytest.mark.slow
def test_video_step_trains_on_chunk_advantages_and_eval_videos_follow_eval_video_cfg(tmp_path):
    eval_videos = tmp_path / "eval_videos"
    cfg = _video_recipe(tmp_path, "runner.max_steps=1", "runner.val_check_interval=1", "runner.save_interval=0",
                        "env.eval.video_cfg.save_video=true", f"env.eval.video_cfg.video_base_dir={eval_videos}",
                        "env.train.video_cfg.save_video=false")
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    with create_cluster(cfg.cluster) as cluster:
        runner = Runner(cfg, log_dir, cluster)
        chunk_advantages = []
        real_update = runner.update
        runner.update = lambda rollout, adv: chunk_advantages.append(adv) or real_update(rollout, adv)
        try:
            runner.fit()
        finally:
            runner.close()
    (adv,) = chunk_advantages
    assert adv.shape == (8, 2)  # 8 videos x 2 latent frames (5 frames, frame_interval 4)
    np.testing.assert_allclose(adv.reshape(2, -1).mean(dim=1), 0.0, atol=1e-5)  # centred per group (mode video)
    (metrics,) = train_metrics(log_dir)
    assert np.isfinite(metrics["train/actor/nft_loss"]) and metrics["train/actor/grad_norm"] > 0
    saved = sorted(p.name for p in eval_videos.glob("*.mp4"))
    # eval at step 0 and step 1, two held-out prompts each; the train videos (save_video false) are not written
    assert saved == [f"eval_samples_step{s:06d}_{i}.mp4" for s in (0, 1) for i in (0, 1)]


def test_evals_score_the_trained_adapter_between_weight_syncs(tmp_path, monkeypatch):
    """runner.weight_sync_interval=3 over 2 steps: no sync after the start, yet each eval samples the adapter the actor
    has trained so far (the one its checkpoint of that step holds), and training rollouts keep sampling the last sync's
    old policy (NFT samples ``ema``; the ``default`` the eval sent is not the training rollout's)."""
    import torch

    from rlrunner.run.runner import run
    from rlrunner.workers.rollout import RolloutWorker

    seen = []  # (mode, step, both adapters as the rollout worker holds them when it samples)
    original = RolloutWorker.generate

    def spy(self, prompts, group_size, step, round_index, mode="train", rows=None):
        seen.append((mode, step, {name: self.model.lora_state_dict(name) for name in ("default", "ema")}))
        return original(self, prompts, group_size, step, round_index, mode, rows)

    monkeypatch.setattr(RolloutWorker, "generate", spy)
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    run(small_recipe(tmp_path, "runner.weight_sync_interval=3", "runner.max_steps=2", "runner.val_check_interval=1",
                     "runner.save_interval=1", "runner.val_before_train=false", "runner.sample_log_interval=0"), log_dir)
    evals = [adapters["default"] for mode, _, adapters in seen if mode == "eval"]
    train = [adapters for mode, _, adapters in seen if mode == "train"]
    assert len(evals) == len(train) == 4  # 2 evals and 2 steps, 2 rollout rounds each (async_reward)
    for step, sampled in zip((1, 1, 2, 2), evals):
        trained = torch.load(log_dir / f"checkpoints/global_step_{step}/actor.pt", weights_only=False)
        for key, value in trained["adapters"]["default"].items():
            assert torch.equal(sampled[key], value), (step, key)
    initial = train[0]
    assert any(not torch.equal(initial["default"][k], evals[0][k]) for k in evals[0])  # step 1 trained it
    for later in train[1:]:  # step 2's rollout after the step-1 eval: still samples the start's old policy
        assert all(torch.equal(initial["ema"][k], v) for k, v in later["ema"].items())

"""The training loop end to end on CPU: in-process and through real Ray actors, logs, eval settings, failures."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from runner_helpers import read_metrics, small_recipe, spy_on_sampling, train_metrics
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlrunner.cluster import WorkerError
from rlrunner.run.runner import Runner, run

REQUIRED_TAGS = {
    "env/avg", "env/reward_errors", "train/actor/nft_loss", "train/actor/ema_tau", "train/actor/delta_v_norm",
    "train/actor/clip_frac", "train/actor/clip_loss_frac", "train/actor/E_pos_mean", "train/actor/E_neg_mean",
    "train/actor/grad_norm", "train/actor/lr", "eval/avg", "time/rollout", "time/reward", "time/train",
    "time/sync", "time/step",
}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("local")
    log_dir = root / "logs" / "run"
    log_dir.mkdir(parents=True)
    run(small_recipe(root, "runner.max_steps=3", "runner.save_interval=0"), log_dir)
    return log_dir


def test_local_run_logs_every_metric_to_tensorboard_and_jsonl(local_run):
    events = EventAccumulator(str(local_run / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert REQUIRED_TAGS <= set(events.Tags()["scalars"])
    assert {"train/samples", "eval/samples"} <= set(events.Tags()["images"])
    steps = [m["step"] for m in train_metrics(local_run)]
    assert steps == [1, 2, 3]
    eval_steps = [m["step"] for m in read_metrics(local_run) if "eval/avg" in m]
    assert eval_steps == [0, 2, 3]  # before training, every val_check_interval, and at the end
    assert all(0.0 <= m["env/avg"] <= 1.0 for m in train_metrics(local_run))
    assert (local_run / "samples" / "eval_samples_step000000.png").is_file()


def test_local_run_reports_its_placement(local_run):
    report = json.loads((local_run / "placement.json").read_text())
    assert [(e["component"], e["rank"], e["node_id"]) for e in report] == [
        ("actor", 0, "local"), ("rollout", 0, "local"), ("env", 0, "local")]


@pytest.mark.slow
def test_the_policy_moves_only_when_the_reward_carries_a_signal(local_run, tmp_path):
    """NFT's gradient at v_theta = v_old is beta^2 (v_theta - v_old) when every advantage is 0 (r = 1/2): exactly 0.
    With ``reward_signal: none`` the LoRA up-projections stay 0, so the policy never moves (grad_norm and Δv are 0 at
    every step); with the rewards it moves from the first step; ``shuffle`` trains on the same rollout (same
    rewards) with permuted advantages, a different gradient."""
    def controlled(signal: str) -> list[dict]:
        log_dir = tmp_path / signal
        log_dir.mkdir()
        run(small_recipe(tmp_path, "runner.max_steps=3", "runner.save_interval=0", "runner.val_check_interval=0",
                         "runner.val_before_train=false", f"algorithm.reward_signal={signal}"), log_dir)
        return train_metrics(log_dir)

    rewarded, unsignalled = train_metrics(local_run), controlled("none")
    assert [m["train/actor/grad_norm"] for m in unsignalled] == [0.0, 0.0, 0.0]
    assert [m["train/actor/delta_v_norm"] for m in unsignalled] == [0.0, 0.0, 0.0]
    assert all(m["train/actor/grad_norm"] > 1e-3 and m["train/actor/delta_v_norm"] > 1e-3 for m in rewarded)
    # the recipe's nft_tau [1.0, 0.5, 0, 2] at the EMA updates of steps 0, 1, 2: 1.0, then linear to 0.5
    assert [m["train/actor/ema_tau"] for m in rewarded] == [1.0, 0.75, 0.5]
    shuffled = controlled("shuffle")
    assert shuffled[0]["env/avg"] == rewarded[0]["env/avg"]  # the same first rollout and rewards
    assert shuffled[0]["train/actor/grad_norm"] != rewarded[0]["train/actor/grad_norm"]


def test_last_step_is_checkpointed_even_without_interval(local_run):
    assert (local_run / "checkpoints" / "global_step_3" / "manifest.json").is_file()


def test_eval_uses_the_eval_sampler_steps_and_prompts(tmp_path, monkeypatch):
    sampled = spy_on_sampling(monkeypatch)
    cfg = small_recipe(tmp_path, "runner.max_steps=1", "actor.model.tiny.eval_sampler=dpm2",
                       "runner.async_reward=false")
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    run(cfg, log_dir)
    calls = [(c["mode"], c["sampler"], c["num_steps"], c["adapter"], c["group_size"], c["prompts"]) for c in sampled]
    evals = [c for c in calls if c[0] == "eval"]
    trains = [c for c in calls if c[0] == "train"]
    assert evals and all(c[1:5] == ("dpm2", 3, "default", 1) for c in evals)
    assert sum(c[5] for c in evals) == 2 * 4  # 4 held-out prompts, at step 0 and at the end
    assert trains and all(c[1:5] == ("euler", 2, "ema", 4) for c in trains)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_run_matches_in_process_run_and_reports_a_dead_worker(tmp_path, local_run):
    """Actor, rollout and env as separate Ray actors give the in-process metrics; a killed worker is named."""
    import ray

    cfg = small_recipe(tmp_path, "runner.max_steps=3", "runner.save_interval=0", "cluster.backend=ray",
                       "cluster.num_devices_per_node=3", "cluster.worker_timeout_s=60",
                       "cluster.component_placement={actor: 0, rollout: 1, env: 2}")
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    from rlrunner.cluster import create_cluster

    with create_cluster(cfg.cluster) as cluster:
        runner = Runner(cfg, log_dir, cluster)
        runner.fit()
        for ours, theirs in zip(train_metrics(log_dir), train_metrics(local_run)):
            for key in ("env/avg", "train/actor/nft_loss", "train/actor/grad_norm", "train/actor/delta_v_norm"):
                np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-7, err_msg=key)
        ray.kill(runner.env._hosts[0], no_restart=True)
        start = time.monotonic()
        with pytest.raises(WorkerError, match=r"env worker rank 0 on \S+"):
            runner.train_step()
        assert time.monotonic() - start < 60
        runner.run_logger.close()


def test_advantages_take_read_only_reward_arrays_as_ray_delivers_them(tmp_path):
    """Arrays that come through Ray's object store are read-only (a single env worker's, with async_reward off, as
    the default recipe runs): the advantages equal the writable arrays' and torch warns about nothing."""
    from types import SimpleNamespace

    from rlrunner.rewards.output import RewardOutput

    cfg = small_recipe(tmp_path)
    scores = np.array([0.1, 0.4, 0.2, 0.9, 0.5, 0.5, 0.3, 0.7], dtype=np.float32)
    frozen = scores.copy()
    frozen.setflags(write=False)
    runner = SimpleNamespace(cfg=cfg, step=1)  # advantages reads only the recipe and the step
    expected = Runner.advantages(runner, RewardOutput(avg=scores))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(Runner.advantages(runner, RewardOutput(avg=frozen)), expected, rtol=0, atol=0)


def test_nonfinite_losses_skip_the_step_and_abort_after_a_streak(tmp_path, monkeypatch):
    import rlrunner.objectives.nft as nft_objective_module

    real_loss = nft_objective_module.nft_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real_loss(*args, **kwargs)
        return loss * float("nan"), {**metrics, "nft_loss": float("nan")}

    monkeypatch.setattr(nft_objective_module, "nft_loss", nan_loss)
    cfg = small_recipe(tmp_path, "runner.max_steps=5", "runner.max_nonfinite_steps=2", "runner.val_before_train=false",
                       "runner.val_check_interval=0", "runner.save_interval=0")
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    with pytest.raises(RuntimeError, match=r"2 steps in a row had a NaN/inf loss"):
        run(cfg, log_dir)
    metrics = train_metrics(log_dir)
    assert [m["train/actor/nonfinite"] for m in metrics] == [1.0]  # the 2nd step aborts before it is logged
    assert not (log_dir / "checkpoints").exists()  # nothing is checkpointed from a diverged run


def test_every_eval_starts_from_the_same_noise(tmp_path, monkeypatch):
    sampled = spy_on_sampling(monkeypatch)
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    run(small_recipe(tmp_path, "runner.max_steps=2", "runner.val_check_interval=1", "runner.save_interval=0",
                     "runner.async_reward=false"), log_dir)
    evals, trains = ([c["noise"] for c in sampled if c["mode"] == mode] for mode in ("eval", "train"))
    assert len(evals) == 3 and all(torch.equal(noise, evals[0]) for noise in evals)  # steps 0, 1, 2
    assert len(trains) == 2 and not torch.equal(trains[0], trains[1])  # training noise is fresh every step
    assert evals[0].shape[0] == 4 and not torch.equal(evals[0], trains[0][:4])

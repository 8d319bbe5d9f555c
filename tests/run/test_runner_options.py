"""Recipe options of the training loop, each against a run without it (same seed, tiny CPU recipe, 2-3 steps):
weight_sync_interval > 1, nft_timesteps_per_sample > 1, the KL anchor through the actor, nft_decay_type and
cluster.enable_offload."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runner_helpers import small_recipe, spy_on_nft_timesteps, train_metrics

import rlrunner.objectives.nft as nft_objective_module
from rlrunner.run.runner import run
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.rollout import RolloutWorker

pytestmark = pytest.mark.slow
QUIET = ("runner.save_interval=0", "runner.val_check_interval=0", "runner.val_before_train=false")


def _run(root: Path, name: str, *overrides: str) -> list[dict]:
    log_dir = root / name
    log_dir.mkdir()
    run(small_recipe(root, *QUIET, *overrides), log_dir)
    return train_metrics(log_dir)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    """The same recipe without any of the options, 3 steps."""
    root = tmp_path_factory.mktemp("reference")
    return _run(root, "reference", "runner.max_steps=3")


def test_weight_sync_interval_keeps_the_rollout_on_the_last_synced_adapters(reference, tmp_path, monkeypatch):
    synced = []
    original = RolloutWorker.sync_weights
    monkeypatch.setattr(RolloutWorker, "sync_weights", lambda self, adapters: synced.append(adapters)
                        or original(self, adapters))
    metrics = _run(tmp_path, "sync2", "runner.max_steps=3", "runner.weight_sync_interval=2")
    assert len(synced) == 2  # at start and after step 2; not after steps 1 and 3
    assert not torch.equal(synced[0]["ema"][next(iter(synced[0]["ema"]))],
                           synced[1]["ema"][next(iter(synced[1]["ema"]))])
    # step 1 samples with the initial adapters either way; step 2 samples with them again (not synced after step 1),
    # so its rollout differs from the reference's; step 3 samples with step 2's adapters in both runs
    assert metrics[0]["env/avg"] == reference[0]["env/avg"]
    assert metrics[1]["env/avg"] != reference[1]["env/avg"]


def test_several_timesteps_per_sample_draw_fresh_noise_levels(reference, tmp_path, monkeypatch):
    times = spy_on_nft_timesteps(monkeypatch)
    metrics = _run(tmp_path, "draws2", "runner.max_steps=1", "algorithm.nft_timesteps_per_sample=2")
    assert len(times) == 8  # 8 samples / micro-batches of 2 = 4 micro-batches, 2 draws each
    for first, second in zip(times[0::2], times[1::2]):
        assert not torch.equal(first, second)  # each draw its own noise level for the same samples
    assert metrics[0]["env/avg"] == reference[0]["env/avg"]  # the same rollout...
    assert metrics[0]["train/actor/nft_loss"] != reference[0]["train/actor/nft_loss"]  # ...trained on twice as many


def test_kl_anchor_uses_the_model_with_adapters_off(reference, tmp_path, monkeypatch):
    pairs = []
    original = nft_objective_module.nft_loss

    def recording(v_theta, *args, **kwargs):
        pairs.append((v_theta.detach().clone(), kwargs["v_base"], kwargs["kl_coef"]))
        return original(v_theta, *args, **kwargs)

    monkeypatch.setattr(nft_objective_module, "nft_loss", recording)
    metrics = _run(tmp_path, "kl", "runner.max_steps=2", "algorithm.ref_kl_coef=0.5")
    assert all(coef == 0.5 and v_base is not None for _, v_base, coef in pairs)
    # before the first optimizer step the LoRA up-projections are 0: the adapted velocity IS the base velocity
    assert torch.equal(pairs[0][0], pairs[0][1])
    assert not torch.equal(pairs[-1][0], pairs[-1][1])
    assert all(m["train/actor/kl"] > 0 for m in metrics) and all(m["train/actor/kl"] == 0 for m in reference)
    assert metrics[1]["train/actor/grad_norm"] != reference[1]["train/actor/grad_norm"]


def test_nft_decay_type_replaces_nft_tau(tmp_path):
    metrics = _run(tmp_path, "decay", "runner.max_steps=3", "algorithm.nft_decay_type=linear_to_0_5")
    # official decay eta = min(0.001 step, 0.5), step counting optimizer steps as the official trainer's global_step:
    # 8 samples per global step, 4 per optimizer step -> 2, 4, 6 optimizer steps at the EMA updates; tau = 1 - eta
    assert [m["train/actor/ema_tau"] for m in metrics] == [1 - 0.002, 1 - 0.004, 1 - 0.006]


def test_enable_offload_swaps_collocated_models_and_changes_no_number(reference, tmp_path, monkeypatch):
    calls = []
    for cls, role in ((ActorWorker, "actor"), (RolloutWorker, "rollout")):
        for method in ("offload", "onload"):
            original = getattr(cls, method)
            monkeypatch.setattr(cls, method, lambda self, _o=original, _n=f"{role}.{method}": calls.append(_n)
                                or _o(self))
    metrics = _run(tmp_path, "offload", "runner.max_steps=3", "cluster.enable_offload=true")
    # each step: the actor leaves the device for the rollout, then the rollout for the update
    assert calls == ["actor.offload", "rollout.onload", "rollout.offload", "actor.onload"] * 3
    for ours, theirs in zip(metrics, reference, strict=True):
        for key in ("env/avg", "train/actor/nft_loss", "train/actor/grad_norm"):
            assert ours[key] == theirs[key], key

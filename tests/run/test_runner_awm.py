"""``algorithm.name: awm`` through the runner: on-policy rollouts, the anchors' adapters, the no-signal control, and
the training noise levels each sample draws."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from runner_helpers import small_recipe, spy_on_sampling, train_metrics

from rlrunner.config.errors import RecipeError
from rlrunner.config.schema import AlgorithmConfig
from rlrunner.models import build_model
from rlrunner.objectives import MicroBatch
from rlrunner.objectives.awm import TIMESTEPS
from rlrunner.run.runner import run


def awm_run(root, *overrides: str) -> list[dict]:
    log_dir = root / "run"
    log_dir.mkdir()
    run(small_recipe(root, "algorithm.name=awm", "runner.max_steps=2", "runner.save_interval=0",
                     "runner.val_check_interval=0", "runner.val_before_train=false", "runner.sample_log_interval=0",
                     "runner.async_reward=false", *overrides), log_dir)
    return train_metrics(log_dir)


def test_awm_samples_with_the_trained_adapter_and_anchors_to_base_and_ema(tmp_path, monkeypatch):
    sampled = spy_on_sampling(monkeypatch)
    metrics = awm_run(tmp_path, "algorithm.ref_kl_coef=0.01", "algorithm.awm_ema_kl_coef=0.5")
    adapters = [(c["mode"], c["adapter"]) for c in sampled]
    assert adapters and set(adapters) == {("train", "default")}  # on-policy
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert math.isfinite(m["train/actor/awm_loss"]) and m["train/actor/nonfinite"] == 0.0
        assert m["train/actor/fm_loss"] > 0 and m["train/actor/grad_norm"] > 0
        # 2 optimizer steps per rollout: the second trains a θ that differs from the base model and from the
        # EMA (a copy of θ at the step's start), so both distances are positive only if each anchor's velocity
        # comes from its own adapter
        assert m["train/actor/kl"] > 0 and m["train/actor/ema_kl"] > 0


def test_awm_without_a_reward_signal_leaves_the_policy_alone(tmp_path):
    """All advantages 0 and no anchors: the AWM loss is exactly 0 with zero gradient (a control run)."""
    metrics = awm_run(tmp_path, "algorithm.reward_signal=none")
    assert [m["train/actor/grad_norm"] for m in metrics] == [0.0, 0.0]
    assert [m["train/actor/awm_loss"] for m in metrics] == [0.0, 0.0]


def test_each_draw_takes_its_stratum_of_the_sampler_grid_and_ignores_its_neighbours(tmp_path):
    cfg = small_recipe(tmp_path, "actor.model.tiny.num_steps=10")
    model = build_model(cfg.actor.model)
    alg = OmegaConf.structured(AlgorithmConfig(name="awm"))  # 6 draws, fraction 0.9
    sigmas = model.sigmas(10)
    x0 = torch.randn(3, *model.latent_shape)

    def draw(index: list[int], d: int, scheme: str = "sampler") -> tuple[torch.Tensor, torch.Tensor]:
        generators = [torch.Generator().manual_seed(1000 * i + d) for i in index]
        micro = MicroBatch({"x0": x0[index]}, {}, generators, d)
        return TIMESTEPS[scheme](model, micro, alg, 10)

    strata = [{1}, {2}, {3, 4}, {5}, {6}, {7, 8}]  # tests/algorithms/test_awm_loss.py: test_band_strata_by_hand
    for d, stratum in enumerate(strata):
        t, noise = draw([0, 1, 2], d)
        assert all(any(math.isclose(v, sigmas[k].item()) for k in stratum) for v in t.tolist())
        alone_t, alone_noise = draw([1], d)
        assert t[1] == alone_t[0] and torch.equal(noise[1], alone_noise[0])
    t, _ = draw([0, 1, 2], 0, "uniform")  # NFT's grid linspace(1, 0, 11)[k], k in 0..9
    assert all(any(math.isclose(v, 1 - k / 10, abs_tol=1e-6) for k in range(10)) for v in t.tolist())


def test_a_recipe_with_an_empty_sampler_band_is_rejected(tmp_path):
    with pytest.raises(RecipeError, match=r"algorithm.awm_timesteps=sampler trains on the sampler's sigmas .* "
                                          r"int\(1 x 0.9\); use num_steps >= 2"):
        small_recipe(tmp_path, "algorithm.name=awm", "actor.model.tiny.num_steps=1")
    assert small_recipe(tmp_path, "algorithm.name=awm", "actor.model.tiny.num_steps=1",
                        "algorithm.awm_timesteps=uniform").algorithm.awm_timesteps == "uniform"
    with pytest.raises(RecipeError, match=r"algorithm.awm_weighting='t\*\*2' is not valid \(did you mean 't2'\?\)"):
        small_recipe(tmp_path, "algorithm.name=awm", "algorithm.awm_weighting=t**2")

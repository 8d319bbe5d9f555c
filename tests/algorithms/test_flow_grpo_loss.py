"""Flow-GRPO: the SDE step and its log-density against hand-computed values and torch's Normal, the clipped GRPO
loss by hand, the SDE integrator's ODE limit, the objective's rollout and loss on the tiny model (ratio 1 on the
first pass), one runner step of plain Flow-GRPO and of Flow-GRPO-Fast, and the recipe checks."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from runner_helpers import small_recipe, train_metrics

from rlrunner.algorithms.flow_grpo_loss import choose_steps, grpo_loss, sde_sample, sde_step_logprob, sde_window
from rlrunner.algorithms.samplers import sample_flow, sigma_schedule
from rlrunner.config.errors import RecipeError
from rlrunner.config.schema import AlgorithmConfig
from rlrunner.distributed.parallelize import Engine
from rlrunner.models import TRAINED_ADAPTER
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.tiny import TinyFlowModel
from rlrunner.models.tiny_text import write_random_tiny
from rlrunner.objectives import MicroBatch, build_objective
from rlrunner.run.runner import run

X = torch.tensor([[1.0, 2.0]])
V = torch.tensor([[0.5, -1.0]])


# ----------------------------------------------------------------------------------------------- the SDE step
def test_sde_step_mean_std_and_log_prob_by_hand():
    """σ = 0.5 → 0.25, a = 0.5: dt = −0.25, std = sqrt(0.5/0.5)·0.5 = 0.5, mean = x·(1 + 0.25/1·(−0.25))
    + v·(1 + 0.25·0.5/1)·(−0.25) = 0.9375·x − 0.28125·v = [0.796875, 2.15625]; the step's std is 0.5·sqrt(0.25)
    = 0.25, so x_next = mean + 0.25·[1, −2] has log-density mean([−1/2, −2]) − log 0.25 − log sqrt(2π)."""
    x_next = torch.tensor([[0.796875 + 0.25, 2.15625 - 0.5]])
    sample, log_prob, mean, std = sde_step_logprob(V, X, torch.tensor([0.5]), torch.tensor([0.25]), 0.75, 0.5,
                                                   prev_sample=x_next)
    assert torch.equal(sample, x_next)
    torch.testing.assert_close(mean, torch.tensor([[0.796875, 2.15625]]))
    torch.testing.assert_close(std, torch.tensor([[0.5]]))
    torch.testing.assert_close(log_prob, torch.tensor([-1.25 + math.log(4) - 0.5 * math.log(2 * math.pi)]))


def test_sde_step_at_sigma_one_uses_sigma_max():
    """σ = 1 → 0.75 with σ_max = 0.75, a = 0.5: std = sqrt(1/(1 − 0.75))·0.5 = 1, mean = x·(1 − 0.125) − 0.25·v."""
    _, _, mean, std = sde_step_logprob(V, X, torch.tensor([1.0]), torch.tensor([0.75]), 0.75, 0.5,
                                       prev_sample=X)
    torch.testing.assert_close(std, torch.tensor([[1.0]]))
    torch.testing.assert_close(mean, torch.tensor([[0.75, 2.0]]))


def test_sde_step_draws_from_the_gaussian_and_log_prob_is_its_mean_log_density():
    g = torch.Generator().manual_seed(0)
    v, x = torch.randn(3, 2, 4, 4, generator=g), torch.randn(3, 2, 4, 4, generator=g)
    sigma, sigma_next = torch.tensor([1.0, 0.6, 0.3]), torch.tensor([0.8, 0.3, 0.0])
    sample, log_prob, mean, std = sde_step_logprob(v, x, sigma, sigma_next, 0.8, 0.7,
                                                   generator=torch.Generator().manual_seed(5))
    step_std = std * (sigma - sigma_next).sqrt().view(-1, 1, 1, 1)
    torch.testing.assert_close(sample, mean + step_std * torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(5)))
    density = torch.distributions.Normal(mean, step_std.expand_as(mean)).log_prob(sample).mean(dim=(1, 2, 3))
    torch.testing.assert_close(log_prob, density)


def test_log_prob_gradient_flows_through_the_mean_only():
    v = V.clone().requires_grad_()
    x_next = torch.tensor([[1.0, 1.0]]).requires_grad_()
    _, log_prob, _, _ = sde_step_logprob(v, X, torch.tensor([0.5]), torch.tensor([0.25]), 0.75, 0.5,
                                         prev_sample=x_next)
    log_prob.sum().backward()
    assert x_next.grad is None and v.grad is not None and v.grad.abs().sum() > 0


# ------------------------------------------------------------------------------------------------- the loss
def test_grpo_loss_clips_ratio_and_advantages_by_hand():
    """clip 0.2; A = [2, −1, 10 → 5, 1]; r = [1.5, 1.5, 0.5, 1.1]. max(−A·r, −A·clip(r)) per sample:
    [max(−3, −2.4), max(1.5, 1.2), max(−2.5, −4), −1.1] = [−2.4, 1.5, −2.5, −1.1], mean −1.125; the gradient
    reaches log π only where the unclipped term wins: −A·r/4 = [0, 0.375, −0.625, −0.275]."""
    old = torch.zeros(4)
    log_prob = torch.tensor([1.5, 1.5, 0.5, 1.1]).log().requires_grad_()
    loss, metrics = grpo_loss(log_prob, old, torch.tensor([2.0, -1.0, 10.0, 1.0]), clip_range=0.2, adv_clip_max=5.0)
    loss.backward()
    assert loss.item() == pytest.approx(-1.125)
    torch.testing.assert_close(log_prob.grad, torch.tensor([0.0, 0.375, -0.625, -0.275]))
    squares = [math.log(1.5) ** 2, math.log(1.5) ** 2, math.log(0.5) ** 2, math.log(1.1) ** 2]
    assert metrics == pytest.approx({"policy_loss": -1.125, "approx_kl": 0.5 * sum(squares) / 4, "clip_frac": 0.75,
                                     "kl": 0.0})


def test_grpo_loss_kl_term_by_hand():
    """(mean − ref)² averaged per sample: [(1 + 4)/2, (0 + 1)/2] = [2.5, 0.5]; over 2·std² with std [1, 0.5]:
    [1.25, 1.0], mean 1.125; the loss adds 0.1·1.125 to the policy loss (0 at ratio 1 and A = 0)."""
    mean, ref = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    std = torch.tensor([[1.0], [0.5]])
    zeros = torch.zeros(2)
    loss, metrics = grpo_loss(zeros, zeros, zeros, clip_range=1e-4, adv_clip_max=5.0, mean=mean, ref_mean=ref,
                              std=std, kl_coef=0.1)
    assert loss.item() == pytest.approx(0.1125) and metrics["kl"] == pytest.approx(1.125)
    assert grpo_loss(zeros, zeros, zeros, clip_range=1e-4, adv_clip_max=5.0, mean=mean, ref_mean=ref,
                     std=std)[1]["kl"] == 0.0  # kl_coef 0: no reference term


# ------------------------------------------------------------------------------------------- the integrator
def _linear_velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return -0.7 * x + t.view(-1, 1, 1) * 0.3


def test_noise_level_zero_gives_the_euler_trajectory_and_small_noise_stays_close():
    noise = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(0))
    sigmas = sigma_schedule(5, shift=3.0)
    x0, trajectory = sample_flow(_linear_velocity, noise, sigmas, sampler="euler", return_trajectory=True)
    all_steps = torch.ones(5, dtype=torch.bool)
    sde_x0, record = sde_sample(_linear_velocity, noise, sigmas, all_steps, 0.0)
    torch.testing.assert_close(sde_x0, x0, rtol=0, atol=1e-6)
    torch.testing.assert_close(record.x, torch.stack(trajectory[:-1], dim=1), rtol=0, atol=1e-6)
    torch.testing.assert_close(record.x_next, torch.stack(trajectory[1:], dim=1), rtol=0, atol=1e-6)
    assert record.step.tolist() == [[0, 1, 2, 3, 4]] * 3
    near_x0, near = sde_sample(_linear_velocity, noise, sigmas, all_steps, 1e-4, torch.Generator().manual_seed(1))
    torch.testing.assert_close(near_x0, x0, rtol=0, atol=1e-3)
    assert torch.isfinite(near.log_prob).all()


def test_sde_window_and_recorded_steps_per_sample():
    g = torch.Generator().manual_seed(0)
    window = sde_window(64, 10, 2, (0, 5), generator=g)
    starts = window.float().argmax(dim=1)
    assert (window.sum(dim=1) == 2).all() and set(starts.tolist()) == {0, 1, 2, 3}  # start in [0, 5 − 2]
    assert torch.equal(window[torch.arange(64), starts + 1], torch.ones(64, dtype=torch.bool))  # consecutive
    assert sde_window(2, 4, 0, (0, 2)).all()  # window 0: every step (plain Flow-GRPO)
    chosen = choose_steps(window, 1, generator=g)
    assert (chosen.sum(dim=1) == 1).all() and not (chosen & ~window).any()
    noise = torch.randn(64, 2, 4, generator=g)
    sigmas = sigma_schedule(10)
    ode_x0 = sample_flow(_linear_velocity, noise, sigmas)
    x0, record = sde_sample(_linear_velocity, noise, sigmas, window, 0.7, g, record_steps=chosen)
    assert record.x.shape == (64, 1, 2, 4) and torch.equal(record.step[:, 0], chosen.float().argmax(dim=1))
    assert not torch.allclose(x0, ode_x0, atol=1e-3)  # the window's noise changed the outcome
    with pytest.raises(ValueError, match="subset of sde_steps"):
        sde_sample(_linear_velocity, noise, sigmas, window, 0.7, record_steps=~window)


# ---------------------------------------------------------------------------------------- objective, runner
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> TinyFlowModel:
    path = write_random_tiny(str(tmp_path_factory.mktemp("tiny")))
    family = OmegaConf.structured(FamilyConfig(resolution=[16, 32], num_steps=4, train_sampler="euler", shift=1.0,
                                               lora_rank=4, lora_alpha=4, max_sequence_length=8))
    model = TinyFlowModel.load(path, family, device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():  # a trained adapter that differs from the base model
        for p in model.adapter_parameters(TRAINED_ADAPTER):
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return model


@pytest.mark.parametrize("overrides", [{}, {"flow_grpo_sde_window_size": 2, "ref_kl_coef": 0.01}])
def test_first_pass_recomputes_the_rollout_log_prob_ratio_one(tiny_model, overrides):
    alg = OmegaConf.structured(AlgorithmConfig(name="flow_grpo", flow_grpo_timestep_fraction=0.5, **overrides))
    objective = build_objective(alg, tiny_model.cfg, tiny_model.resolved_guidance)
    cond = tiny_model.encode_prompts(['a sign that says "42"', 'a sign that says "7"'])
    noise = torch.randn(2, *tiny_model.latent_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        x0, kept = objective.rollout(tiny_model, cond, noise, torch.Generator().manual_seed(3))
    assert objective.draws() == (1 if overrides else 2) and kept["sde_x"].shape == (2, objective.draws(), *noise.shape[1:])
    advantages = torch.tensor([1.5, -7.0])
    for draw in range(objective.draws()):
        micro = MicroBatch({"x0": x0, "advantages": advantages, **kept}, cond, [], draw)
        loss, metrics = objective.loss(tiny_model, Engine(tiny_model), micro)
        assert metrics["approx_kl"] < 1e-10 and metrics["clip_frac"] == 0.0
        assert metrics["policy_loss"] == pytest.approx(-(1.5 - 5.0) / 2, abs=1e-5)  # −mean(clip(A, ±5))
        assert (metrics["kl"] > 0) == ("ref_kl_coef" in overrides)
        loss.backward()
    assert all(p.grad is not None for p in tiny_model.trainable_parameters())


@pytest.mark.slow
@pytest.mark.parametrize("window", [0, 1])
def test_one_runner_step_of_flow_grpo_and_its_fast_window(tmp_path: Path, window):
    log_dir = tmp_path / "logs" / "run"
    log_dir.mkdir(parents=True)
    run(small_recipe(tmp_path, "algorithm.name=flow_grpo", f"algorithm.flow_grpo_sde_window_size={window}",
                     "algorithm.flow_grpo_sde_window_range=[0,2]", "runner.max_steps=1", "runner.save_interval=0",
                     "runner.val_before_train=false"), log_dir)
    (metrics,) = train_metrics(log_dir)
    assert metrics["train/actor/nonfinite"] == 0.0 and metrics["train/actor/grad_norm"] > 0
    assert math.isfinite(metrics["train/actor/policy_loss"]) and metrics["train/actor/kl"] == 0.0
    # two optimizer steps per rollout: the first is on-policy (ratio 1), the second already clipped by 1e-4
    assert metrics["train/actor/clip_frac"] <= 0.5


@pytest.mark.parametrize(("overrides", "message"), [
    (["actor.model.tiny.train_sampler=dpm2"], "train_sampler='dpm2' but algorithm.name=flow_grpo samples with Euler"),
    (["actor.model.tiny.guidance_scale=4.5"], "guidance_scale=4.5 but algorithm.name=flow_grpo trains without"),
    (["algorithm.flow_grpo_sde_window_size=3"], "flow_grpo_sde_window_size=3 in algorithm.flow_grpo_sde_window_range"),
    (["algorithm.flow_grpo_sde_window_size=1", "algorithm.flow_grpo_sde_window_range=[1,3]"],
     "algorithm.flow_grpo_sde_window_range=[1, 3] does not fit actor.model.tiny.num_steps=2"),
    (["algorithm.adv_type=grpo_video", "algorithm.advantage_mode=video"],
     "algorithm.adv_type='grpo_video' but algorithm.name=flow_grpo takes one advantage per sample"),
    (["algorithm.flow_grpo_sde_window_range=[2,1]"], "algorithm.flow_grpo_sde_window_range=[2, 1] must be null or"),
    (["algorithm.flow_grpo_timestep_fraction=0"], "algorithm.flow_grpo_timestep_fraction=0.0 must be a number > 0"),
    (["algorithm.flow_grpo_noise_level=0"], "algorithm.flow_grpo_noise_level=0.0 must be a number > 0"),
    (["algorithm.flow_grpo_clip_range=-1"], "algorithm.flow_grpo_clip_range=-1.0 must be a number > 0"),
])
def test_recipe_checks_name_the_keys(tmp_path: Path, overrides, message):
    with pytest.raises(RecipeError) as err:
        small_recipe(tmp_path, "algorithm.name=flow_grpo", *overrides)
    assert message in str(err.value) and "\n" not in str(err.value)

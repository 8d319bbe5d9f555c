"""NFT options of NVlabs' trainer through the actor on the tiny CPU model: ``nft_timesteps_per_sample`` K > 1 trains
each sample at K distinct noise levels, seeded by sample position (not by rank or batch), and ``ref_kl_coef``'s
anchor pulls v_θ toward the base model (adapters off)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from omegaconf import OmegaConf
from runner_helpers import small_recipe, spy_on_nft_timesteps

from rlrunner.algorithms.samplers import sample_xt, training_grid
from rlrunner.config.schema import AlgorithmConfig
from rlrunner.models.guidance import Guidance
from rlrunner.objectives import build_objective
from rlrunner.objectives.base import MicroBatch
from rlrunner.step.batch import Batch
from rlrunner.step.sample_order import TrainPlan
from rlrunner.workers.actor import ActorWorker, _cond
from rlrunner.workers.rollout import RolloutWorker

PROMPTS = ['a sign that says "2345"', 'a sign that says "2346"']
ADVANTAGES = torch.linspace(-1.0, 1.0, 8)


def _setup(tmp_path, *overrides: str) -> tuple[ActorWorker, Batch]:
    cfg = small_recipe(tmp_path, *overrides)
    actor = ActorWorker(cfg.actor, cfg.algorithm, num_train_steps=2)
    rollout = RolloutWorker(cfg.actor.model, seed=0, algorithm_cfg=cfg.algorithm)
    return actor, rollout.generate(PROMPTS, 4, step=0, round_index=0).train


def _micro(actor: ActorWorker, batch: Batch, rows: list[int], step: int, draw: int) -> MicroBatch:
    micro = batch.select(torch.tensor(rows))
    micro.tensors.update(advantages=ADVANTAGES[rows], sample_index=torch.tensor(rows))
    return MicroBatch(dict(micro.tensors), _cond(micro, actor.model.device),
                      actor._noise_generators(micro, step, draw), draw, actor._level_generators(micro, step))


def test_an_update_trains_each_sample_at_distinct_levels(tmp_path, monkeypatch):
    # 2 sampler steps: the grid is [1, 0.5], so K = 2 distinct draws are both levels of every sample
    actor, train = _setup(tmp_path, "algorithm.nft_timesteps_per_sample=2")
    times = spy_on_nft_timesteps(monkeypatch)
    actor.update([train], torch.arange(8), torch.arange(8), ADVANTAGES, step=0)
    # passes: per optimizer step (4 samples) and micro-batch (2 samples), draw 0 then draw 1
    assert len(times) == 8
    for call in range(0, 8, 2):
        for first, second in zip(times[call].tolist(), times[call + 1].tolist()):
            assert {first, second} == {1.0, 0.5}


def test_levels_depend_on_the_sample_position_not_on_the_ranks_or_the_batch(tmp_path):
    actor, train = _setup(tmp_path, "algorithm.nft_timesteps_per_sample=3", "actor.model.tiny.num_steps=4")
    one_rank = {draw: actor.objective._distinct_levels(_micro(actor, train, list(range(8)), 5, draw), 4)
                for draw in range(3)}
    assert all(len(set(row)) == 3 for row in torch.stack(list(one_rank.values()), dim=1).tolist())
    plan = TrainPlan.build(seed=0, step=5, num_samples=8, global_batch_size=4, world_size=2)
    for rank in range(2):
        for micro_rows in plan.group_positions(rank).split(2):  # each rank's micro-batches of 2 positions
            rows = micro_rows.tolist()
            for draw in range(3):
                levels = actor.objective._distinct_levels(_micro(actor, train, rows, 5, draw), 4)
                assert torch.equal(levels, one_rank[draw][rows])


def test_one_level_per_sample_is_drawn_from_the_noise_generator_as_before(tmp_path, monkeypatch):
    actor, train = _setup(tmp_path)  # nft_timesteps_per_sample = 1 (default): the default recipe's draws
    times = spy_on_nft_timesteps(monkeypatch)
    micro = _micro(actor, train, [0, 1, 2, 3], 2, 0)
    actor.objective.loss(actor.model, actor.engine, micro)
    grid = training_grid("uniform", actor.model.sigmas(2))
    _, expected_t, _ = sample_xt(micro.x0, grid, generator=actor._noise_generators(micro, 2, 0))
    assert torch.equal(times[0], expected_t)


def _anchor_gradient(actor: ActorWorker, micro_of: Callable[[], MicroBatch], coef: float) -> tuple[list[torch.Tensor], float]:
    """Gradient of ``coef·mean((v_θ - v_base)²)`` alone: the loss with the anchor minus the loss without, at the same
    draws; and the ``kl`` metric."""
    without = copy.copy(actor.objective)
    without.alg = OmegaConf.merge(actor.objective.alg, {"ref_kl_coef": 0.0})
    assert actor.objective.alg.ref_kl_coef == coef
    grads, kls = [], []
    for objective in (actor.objective, without):
        actor.optimizer.zero_grad(set_to_none=True)
        loss, metrics = objective.loss(actor.model, actor.engine, micro_of())
        loss.backward()
        grads.append([p.grad.clone() for p in actor.params])
        kls.append(metrics["kl"])
    return [a - b for a, b in zip(*grads)], kls[0]


def _distance_to_base(actor: ActorWorker, micro: MicroBatch) -> float:
    """mean((v_θ - v_base)²) at the micro-batch's training states, written from the definition."""
    grid = training_grid("uniform", actor.model.sigmas(2))
    x_t, t, _ = sample_xt(micro.x0, grid, generator=micro.generators)
    with torch.no_grad():
        v_theta = actor.engine.velocity(x_t, t, micro.cond)
        v_base = actor.model.velocity(x_t, t, micro.cond, adapter=None)
    return float((v_theta.float() - v_base.float()).square().mean())


def test_the_kl_anchor_is_flat_at_the_base_model_and_pulls_v_theta_toward_it(tmp_path):
    actor, train = _setup(tmp_path, "algorithm.ref_kl_coef=1e-4")
    coef = 1e-4

    def micro_of() -> MicroBatch:  # fresh generators: every call sees the same x_t
        return _micro(actor, train, [0, 1, 2, 3], 0, 0)

    # at θ = base (LoRA B = 0 at init) the anchor is 0 and adds no gradient
    grads, kl = _anchor_gradient(actor, micro_of, coef)
    assert kl == 0.0 and all(float(g.abs().max()) == 0.0 for g in grads)

    with torch.no_grad():  # move the trained adapter away from the base model
        generator = torch.Generator().manual_seed(1)
        for p in actor.params:
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    grads, kl = _anchor_gradient(actor, micro_of, coef)
    before = _distance_to_base(actor, micro_of())
    assert kl == pytest.approx(before, rel=1e-5) and before > 0
    assert any(float(g.abs().max()) > 0 for g in grads)
    with torch.no_grad():  # a small step down the anchor's gradient (largest change 1e-3) brings v_θ closer to v_base
        step = 1e-3 / max(float(g.abs().max()) for g in grads)
        for p, g in zip(actor.params, grads):
            p.sub_(step * g)
    assert _distance_to_base(actor, micro_of()) < before


@pytest.mark.parametrize(("guidance", "keeps"), [
    (Guidance("none", 1.0, 1.0), True), (Guidance("cfg", 1.0, 4.5), True),  # one pass a step: v_ema itself
    (Guidance("embedded", 3.5, 3.5), True),  # FLUX.1-dev: the scale is a model input, one pass, as in the loss
    (Guidance("cfg", 4.5, 4.5), False),  # two passes combined: the sampler's velocity is not v_ema
])
def test_the_rollout_keeps_v_old_exactly_when_a_sampling_step_is_one_pass_of_the_model(guidance, keeps):
    """Decided from the resolved guidance, not the recipe's raw guidance_scale (which refused FLUX.1-dev's cache)."""
    alg = OmegaConf.structured(AlgorithmConfig(name="nft", nft_xcur_source="rollout", nft_timesteps_per_sample=2))
    family = OmegaConf.create({"guidance_scale": guidance.scale})
    objective = build_objective(alg, family, guidance)
    assert objective.keeps_velocity is keeps
    assert objective.kept_latents_per_sample() == (4 if keeps else 2)  # the states, and v_old beside each

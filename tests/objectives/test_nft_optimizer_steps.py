"""Several NFT optimizer steps per rollout (``actor.global_batch_size`` below the samples per step), as NVlabs'
``sd3_ocr`` takes 2: each step trains its own share of the rollout against the same old (EMA) policy, and the
EMA moves once, after the last one, at the official decay of the optimizer steps taken so far (NVlabs'
``scripts/train_nft_sd3.py``: ``return_decay(global_step, ...)`` after the inner loop, ``global_step`` counting
gradient steps)."""

from __future__ import annotations

import math

import torch
from runner_helpers import small_recipe

from rlrunner.models import EMA_ADAPTER, TRAINED_ADAPTER
from rlrunner.objectives.base import MicroBatch
from rlrunner.step.batch import Batch
from rlrunner.step.sample_order import noise_seed
from rlrunner.workers.actor import ActorWorker, _cond
from rlrunner.workers.rollout import RolloutWorker

PROMPTS = ['a sign that says "2345"', 'a sign that says "2346"']
ADVANTAGES = torch.linspace(-1.0, 1.0, 8)
# with SMALL_OVERRIDES' 8 samples per step in optimizer steps of actor.global_batch_size=4: 2 per rollout;
# NVlabs' decay type 1 (0.001 per optimizer step) tells 1 counted step from 2
OFFICIAL_DECAY = ["algorithm.nft_decay_type=linear_to_0_5"]


def _actor_and_rollout(tmp_path, *overrides: str) -> tuple[ActorWorker, Batch]:
    cfg = small_recipe(tmp_path, *OFFICIAL_DECAY, *overrides)
    actor = ActorWorker(cfg.actor, cfg.algorithm, num_train_steps=2)
    with torch.no_grad():  # the same move away from the EMA adapter in every actor: v_θ ≠ v_old from the start
        generator = torch.Generator().manual_seed(1)
        for p in actor.model.adapter_parameters(TRAINED_ADAPTER):
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    rollout = RolloutWorker(cfg.actor.model, seed=0, algorithm_cfg=cfg.algorithm)
    return actor, rollout.generate(PROMPTS, 4, step=0, round_index=0).train


def _half_loss(actor: ActorWorker, train: Batch, rows: list[int], step: int) -> torch.Tensor:
    """The NFT loss of one optimizer step's samples in one pass (the actor may split it into micro-batches), each
    sample's noise from its own seed (seed, step, position, draw 0)."""
    micro = train.select(torch.tensor(rows))
    micro.tensors.update(advantages=ADVANTAGES[rows], sample_index=torch.tensor(rows))
    generators = [torch.Generator().manual_seed(noise_seed(actor.cfg.seed, step, row, 0)) for row in rows]
    loss, _ = actor.objective.loss(actor.model, actor.engine,
                                   MicroBatch(dict(micro.tensors), _cond(micro, actor.model.device), generators, 0))
    return loss


def _adamw_by_hand(params: list[torch.Tensor], state: list[dict], optim, k: int) -> None:
    """Step k (from 1) of torch's AdamW, written out: decoupled weight decay, bias-corrected moments."""
    lr, (b1, b2) = optim.lr, (optim.adam_beta1, optim.adam_beta2)
    with torch.no_grad():
        for p, s in zip(params, state):
            g = p.grad
            s["m"] = b1 * s.get("m", torch.zeros_like(p)) + (1 - b1) * g
            s["v"] = b2 * s.get("v", torch.zeros_like(p)) + (1 - b2) * g * g
            p.mul_(1 - lr * optim.weight_decay)
            p.sub_(lr / (1 - b1**k) * s["m"] / ((s["v"] / (1 - b2**k)).sqrt() + optim.adam_eps))


def _clip_by_hand(params: list[torch.Tensor], max_norm: float) -> None:
    norm = math.sqrt(sum(float(p.grad.square().sum()) for p in params))
    with torch.no_grad():
        for p in params:
            p.grad.mul_(min(1.0, max_norm / (norm + 1e-6)))


def _two_steps_by_hand(actor: ActorWorker, train: Batch, ema_between: bool = False) -> list[torch.Tensor]:
    """The trained adapter after the rollout's two optimizer steps replayed by hand (``ema_between``: the wrong order,
    the EMA adapter moved after the first step, as one EMA update per optimizer step would)."""
    params, state = actor.model.adapter_parameters(TRAINED_ADAPTER), [{} for _ in actor.params]
    assert [p.data_ptr() for p in params] == [p.data_ptr() for p in actor.params]
    for k, rows in enumerate(([0, 1, 2, 3], [4, 5, 6, 7]), start=1):  # the k-th 4 positions: optimizer step k
        for p in params:
            p.grad = None
        _half_loss(actor, train, rows, step=0).backward()  # v_old: the EMA adapter as the rollout left it
        _clip_by_hand(params, actor.cfg.optim.clip_grad)
        _adamw_by_hand(params, state, actor.cfg.optim, k)
        if ema_between and k == 1:
            with torch.no_grad():
                for e, p in zip(actor.model.adapter_parameters(EMA_ADAPTER), params):
                    e.lerp_(p, 1 - 0.001)
    return [p.detach().clone() for p in params]


def _max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.detach() - y.detach()).abs().max()) for x, y in zip(a, b))


def test_two_optimizer_steps_per_rollout_equal_two_steps_by_hand_with_one_ema_update_at_the_end(tmp_path):
    one_pass = "actor.micro_batch_size=4"  # one micro-batch per optimizer step: the hand replay's single pass
    actor, train = _actor_and_rollout(tmp_path, one_pass)
    ema_before = [p.clone() for p in actor.model.adapter_parameters(EMA_ADAPTER)]

    metrics = actor.update([train], torch.arange(8), torch.arange(8), ADVANTAGES, step=0)
    tau = actor.ema_update(0)

    by_hand = _two_steps_by_hand(_actor_and_rollout(tmp_path, one_pass)[0], train)  # the same initial adapters
    # the EMA once, after both steps: tau = 1 - official decay at global_step 2 (linear_to_0_5: 0.001 per step)
    assert actor.optimizer_steps == 2 and tau == 1 - 0.002
    expected_ema = [(1 - tau) * e + tau * p for e, p in zip(ema_before, by_hand)]

    trained = actor.model.adapter_parameters(TRAINED_ADAPTER)
    # an Adam step moves a weight by up to lr = 1e-2; float32 rounding (torch's order of operations against ours)
    # differs by 6e-7 here
    assert _max_difference(trained, by_hand) < 1e-5
    assert _max_difference(actor.model.adapter_parameters(EMA_ADAPTER), expected_ema) < 1e-5
    assert _max_difference(trained, ema_before) > 1e-3  # the steps did move θ
    assert metrics["nonfinite"] == 0.0
    # an EMA that moved between the two steps gives the second step another v_old: far outside the tolerance (1.7e-2)
    wrong = _two_steps_by_hand(_actor_and_rollout(tmp_path, one_pass)[0], train, ema_between=True)
    assert _max_difference(wrong, by_hand) > 1e-3


def test_the_official_decay_counts_both_optimizer_steps_of_each_rollout(tmp_path):
    # official: after rollout e with 2 gradient steps each, global_step = 2(e + 1), decay = 0.001·global_step
    # (decay_type 1); with one optimizer step per rollout it would be e + 1
    for global_batch_size, steps_per_rollout in ((4, 2), (8, 1)):
        actor, train = _actor_and_rollout(tmp_path, f"actor.global_batch_size={global_batch_size}")
        taus = []
        for step in range(3):
            actor.update([train], torch.arange(8), torch.arange(8), ADVANTAGES, step=step)
            taus.append(actor.ema_update(step))
        assert actor.optimizer_steps == 3 * steps_per_rollout
        expected = [1 - 0.001 * (steps_per_rollout * (e + 1)) for e in range(3)]
        assert taus == expected, (global_batch_size, taus)

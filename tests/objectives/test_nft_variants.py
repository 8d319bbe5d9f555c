"""NFT as NVlabs' trainer runs it and NFT without the extra forward, on the tiny CPU recipe:
``nft_train_timesteps: sampler``, ``nft_decay_type`` counted in optimizer steps, and ``nft_xcur_source: rollout``
with the rollout's own ``v_old`` reused exactly when it is the actor's (recomputed otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runner_helpers import assert_same_adapters, run_small, small_recipe, spy_on_nft_timesteps, train_metrics

from rlrunner.algorithms.samplers import sigma_schedule
from rlrunner.run.runner import Runner
from rlrunner.step.batch import Batch
from rlrunner.utils.seeding import derive_seed
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.rollout import RolloutWorker

QUIET = ("runner.val_check_interval=0", "runner.val_before_train=false")
ROLLOUT_STATES = ("algorithm.nft_xcur_source=rollout", "algorithm.nft_timesteps_per_sample=2")
PROMPTS = ['a sign that says "2345"', 'a sign that says "2346"']


def _run(root: Path, name: str, *overrides: str) -> Path:
    return run_small(root, name, *QUIET, *overrides)


def _micro(batch: Batch, advantages: torch.Tensor) -> Batch:
    micro = batch.select(torch.arange(len(batch)))
    micro.tensors.update(advantages=advantages, sample_index=torch.arange(len(batch)))
    return micro


def test_rollout_states_and_the_cached_v_old_give_the_recomputed_loss(tmp_path):
    cfg = small_recipe(tmp_path, *ROLLOUT_STATES)
    actor = ActorWorker(cfg.actor, cfg.algorithm, num_train_steps=2)
    rollout = RolloutWorker(cfg.actor.model, seed=0, algorithm_cfg=cfg.algorithm)
    # an EMA adapter away from its init: one update on a first rollout, EMA copies it (tau 1), sent to the rollout
    rollout.sync_weights(actor.lora_weights())
    first = rollout.generate(PROMPTS, 4, step=0, round_index=0).train
    actor.update([first], torch.arange(8), torch.arange(8), torch.linspace(-1, 1, 8), step=0)
    actor.ema_update(0)
    rollout.sync_weights(actor.lora_weights())
    train = rollout.generate(PROMPTS, 4, step=1, round_index=0).train

    # two distinct states per sample, at the sampler's sigmas; the one at sigma 1 is the rollout's noise
    xcur, t = train.tensors["nft_xcur"], train.tensors["nft_t"]
    assert xcur.shape == (8, 2, *train.tensors["x0"].shape[1:]) and train.tensors["nft_v_old"].shape == xcur.shape
    sigmas = sigma_schedule(2, float(cfg.actor.model.tiny.shift))[:2]
    assert all(sorted(row.tolist()) == sorted(sigmas.tolist()) for row in t)
    generator = torch.Generator().manual_seed(derive_seed(0, "rollout-train", 0, 1, 0))
    noise = torch.randn(xcur[:, 0].shape, generator=generator)
    assert torch.equal(xcur[t == 1.0], noise)

    micro = _micro(train, torch.linspace(-1.0, 1.0, 8))
    losses = {}
    for mode in ("cached", "recomputed"):
        actor.objective.begin_update(actor.model)
        if mode == "recomputed":
            actor.objective.ema_digest = None
        for draw in range(2):
            actor.optimizer.zero_grad(set_to_none=True)
            loss, metrics = actor._micro_loss(micro, [], draw)
            loss.backward()
            assert metrics["v_old_cached"] == float(mode == "cached")
            losses[mode, draw] = (loss.detach(), [p.grad.clone() for p in actor.params])
    for draw in range(2):
        (cached, cached_grads), (recomputed, recomputed_grads) = losses["cached", draw], losses["recomputed", draw]
        torch.testing.assert_close(cached, recomputed, rtol=1e-5, atol=1e-7)
        for a, b in zip(cached_grads, recomputed_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert not torch.equal(losses["cached", 0][0], losses["cached", 1][0])  # each draw its own state

    # once the EMA moves on, the rollout's adapter is not the actor's EMA: its update recomputes v_old
    metrics = actor.update([train], torch.arange(8), torch.arange(8), torch.linspace(-1, 1, 8), step=1)
    assert metrics["v_old_cached"] == 1.0
    actor.ema_update(1)  # tau 0.75 toward the adapter just trained
    actor.objective.begin_update(actor.model)
    assert actor._micro_loss(micro, [], 0)[1]["v_old_cached"] == 0.0


def test_with_guidance_the_rollout_keeps_no_velocity(tmp_path):
    cfg = small_recipe(tmp_path, *ROLLOUT_STATES, "actor.model.tiny.guidance_scale=2.0")
    rollout = RolloutWorker(cfg.actor.model, seed=0, algorithm_cfg=cfg.algorithm)
    train = rollout.generate(PROMPTS, 4, step=0, round_index=0).train
    assert sorted(train.tensors) == ["nft_t", "nft_xcur", "x0"]  # the guided velocity is not v_old
    actor = ActorWorker(cfg.actor, cfg.algorithm, num_train_steps=1)
    actor.objective.begin_update(actor.model)
    loss, metrics = actor._micro_loss(_micro(train, torch.linspace(-1.0, 1.0, 8)), [], 1)
    assert metrics["v_old_cached"] == 0.0 and torch.isfinite(loss)


def test_the_actor_counts_the_decay_in_optimizer_steps(tmp_path):
    cfg = small_recipe(tmp_path, "algorithm.nft_decay_type=delayed_linear_to_0_999")
    actor = ActorWorker(cfg.actor, cfg.algorithm, num_train_steps=100)
    for optimizer_steps, eta in ((0, 0.0), (75, 0.0), (76, 0.0075), (80, 0.0375), (300, 0.999)):
        actor.optimizer_steps = optimizer_steps
        assert actor.tau(step=3) == pytest.approx(1 - eta)  # the global step does not enter
    state = actor.state_dict()
    restored = ActorWorker(cfg.actor, cfg.algorithm, num_train_steps=100)
    restored.load_state_dict(state)
    assert restored.optimizer_steps == 300 and restored.tau(step=0) == actor.tau(step=3)


@pytest.mark.slow
def test_sampler_timesteps_equal_uniform_at_shift_1_and_are_the_shifted_sigmas_at_shift_3(tmp_path, monkeypatch):
    steps = ("runner.max_steps=2", "runner.save_interval=0")
    uniform = _run(tmp_path, "uniform", *steps)
    sampler = _run(tmp_path, "sampler", *steps, "algorithm.nft_train_timesteps=sampler")
    assert_same_adapters(uniform / "checkpoints/global_step_2", sampler / "checkpoints/global_step_2")

    times = spy_on_nft_timesteps(monkeypatch)
    _run(tmp_path, "shift3", "runner.max_steps=1", "runner.save_interval=0", "algorithm.nft_train_timesteps=sampler",
         "actor.model.tiny.shift=3.0", "algorithm.nft_timesteps_per_sample=2")
    drawn = torch.cat(times)
    assert len(drawn) == 16 and set(drawn.tolist()) == set(sigma_schedule(2, 3.0)[:2].tolist())  # {1.0, 0.75}


@pytest.mark.slow
@pytest.mark.parametrize(("option", "cached"), [("runner.rollout_ahead=true", [1.0, 0.0, 0.0]),
                                                ("runner.weight_sync_interval=2", [1.0, 0.0, 1.0])])
def test_a_rollout_sampled_by_a_stale_ema_recomputes_v_old(tmp_path, option, cached):
    # the EMA moves after every step (nft_tau 1.0 then 0.75): a rollout is exact only right after a sync. Ahead, step
    # k+1 samples before step k's EMA update; with interval 2, step 2 samples with the adapters synced before step 1
    metrics = train_metrics(_run(tmp_path, "stale", "runner.max_steps=3", "runner.save_interval=0", *ROLLOUT_STATES,
                                 option))
    assert [m["train/actor/v_old_cached"] for m in metrics] == cached


@pytest.mark.slow
def test_rollout_states_resume_exactly(tmp_path, monkeypatch):
    """4 steps against 2 steps, stop, resume for 2 more: bitwise the same adapters and logged numbers."""
    options = ("runner.max_steps=4", "runner.save_interval=2", *ROLLOUT_STATES, "algorithm.nft_decay_type=linear_to_0_5")
    full = _run(tmp_path, "20260101-000000-states", *options)
    original = Runner.train_step

    def interrupt(self):
        if self.step == 2:
            raise KeyboardInterrupt
        return original(self)

    with monkeypatch.context() as patch:
        patch.setattr(Runner, "train_step", interrupt)
        with pytest.raises(KeyboardInterrupt):
            _run(tmp_path, "20260101-000001-states", *options)
    partial = tmp_path / "logs" / "20260101-000001-states" / "checkpoints" / "global_step_2"
    resumed = _run(tmp_path, "20260101-000002-states", *options, f"runner.resume_dir={partial}")
    assert_same_adapters(full / "checkpoints/global_step_4", resumed / "checkpoints/global_step_4")
    ours, reference = train_metrics(resumed), train_metrics(full)[2:]
    assert [m["step"] for m in ours] == [3, 4]
    for mine, theirs in zip(ours, reference):
        for key in ("env/avg", "train/actor/nft_loss", "train/actor/grad_norm", "train/actor/ema_tau",
                    "train/actor/v_old_cached"):
            assert mine[key] == theirs[key], key
    assert all(m["train/actor/v_old_cached"] == 1.0 for m in ours)

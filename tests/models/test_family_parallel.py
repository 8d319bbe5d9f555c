"""Every family trains the same adapters on one actor rank and on two gloo ranks, with DDP and with FSDP2.

The real :class:`~rlrunner.workers.actor.ActorWorker` of each family's tiny folder runs two NFT updates (one optimizer
step each) on 8 rollout samples; on two ranks each rank trains its own 4 (the rows the data plane gives it). Both
ranks must end with the adapters of the one-rank run: a LoRA parameter that never receives a gradient (Qwen-Image's
last text-stream projection did) leaves DDP's bucket unreduced, so the ranks drift apart silently and the second
step fails.

Wan2.2 A14B trains two experts: its actor seed is picked so that the first update's training timesteps fall on both
sides of the expert boundary and all of the second update's on one side (the other expert's adapter gets no sample
in that optimizer step: it must still be reduced, and stay equal on every rank).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from cp_helpers import high_noise_rows
from family_helpers import encode_prompt_batch
from omegaconf import OmegaConf

from rlrunner.distributed.process_group import find_free_port
from rlrunner.step.batch import Batch
from rlrunner.step.sample_order import optimizer_step_shards

FAMILIES = ["sd3", "wan22_ti2v_5b", "qwen_image"]
FAMILIES += ["zimage"]
FAMILIES += ["flux2_klein"]
FAMILIES += ["flux1"]
FAMILIES += ["wan22_t2v_a14b", "wan21_t2v"]
A14B = "wan22_t2v_a14b"
PROMPTS = ['a sign that says "open"', "a cat", 'the word "rl"', "a dog"]
SAMPLES, STEPS = 8, 2


def _actor_cfg(model_cfg, strategy: str, seed: int):
    from rlrunner.config.schema import ActorConfig

    cfg = OmegaConf.structured(ActorConfig(micro_batch_size=2, global_batch_size=SAMPLES, strategy=strategy,
                                           seed=seed))
    cfg.model = model_cfg
    cfg.optim.lr = 1e-2  # large enough that two steps move every adapter well past the tolerance
    return cfg


def _train(model_cfg, rollout: Batch, advantages: torch.Tensor, seed: int, strategy: str, rank: int,
           world_size: int, steps: int = STEPS):
    """``steps`` updates of the family's actor on this rank's rows; both adapters as this rank holds them (gathered
    from the shards with FSDP2: a collective, which every rank joins)."""
    from rlrunner.config.schema import AlgorithmConfig
    from rlrunner.workers.actor import ActorWorker

    worker = ActorWorker(_actor_cfg(model_cfg, strategy, seed), OmegaConf.structured(AlgorithmConfig()), STEPS,
                         rank=rank, world_size=world_size)
    rows = optimizer_step_shards(SAMPLES, SAMPLES, world_size)[rank]
    for step in range(steps):
        metrics = worker.update([rollout], rows, rows, advantages[rows], step)
        assert metrics["grad_norm"] > 0
    weights = {adapter: worker.model.lora_state_dict(adapter) for adapter in ("default", "ema")}
    del worker
    return weights


def _rank_main(rank: int, port: int, jobs: dict, out: str) -> None:
    """Every family's two-rank runs in one pair of processes (imports and the process group are paid once)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    for model_type, (model_cfg, rollout, advantages, seed) in jobs.items():
        for strategy in ("ddp", "fsdp2"):
            weights = _train(model_cfg, rollout, advantages, seed, strategy, rank, 2)
            torch.save(weights, f"{out}/{model_type}.{strategy}.{rank}")


def _rollout(model, seed: int = 0) -> Batch:
    """8 clean latents over 4 prompts (two per prompt) with the prompts' conditioning, as a rollout part holds."""
    gen = torch.Generator().manual_seed(seed)
    cond = encode_prompt_batch(model, PROMPTS)
    x0 = torch.randn((SAMPLES, *model.latent_shape), generator=gen)
    return Batch({"x0": x0}, {}, {f"cond.{k}": v for k, v in cond.items()},
                 torch.arange(len(PROMPTS)).repeat_interleave(SAMPLES // len(PROMPTS)))


def a14b_seed() -> int:
    """The first actor seed whose update 0 trains both experts and whose update 1 trains one of them only."""
    return next(seed for seed in range(10_000) if len(set(high_noise_rows(seed, 0, SAMPLES))) == 2
                and len(set(high_noise_rows(seed, 1, SAMPLES))) == 1)


@pytest.fixture(scope="module")
def two_rank_runs(tiny_model_cfg, tmp_path_factory):
    """``(jobs, folder)``: each family's inputs, and the folder where the two-rank runs left each rank's adapters."""
    from rlrunner.models import build_model

    jobs = {}
    for model_type in FAMILIES:
        model_cfg = tiny_model_cfg(model_type)
        seed = a14b_seed() if model_type == A14B else 42
        jobs[model_type] = (model_cfg, _rollout(build_model(model_cfg)), torch.linspace(-2.0, 2.0, SAMPLES), seed)
    out = tmp_path_factory.mktemp("two_ranks")
    mp.spawn(_rank_main, args=(find_free_port(), jobs, str(out)), nprocs=2, join=True)
    return jobs, out


@pytest.mark.slow
@pytest.mark.parametrize("model_type", FAMILIES)
def test_two_gloo_ranks_train_the_one_rank_adapters_with_ddp_and_fsdp2(model_type, two_rank_runs):
    jobs, out = two_rank_runs
    model_cfg, rollout, advantages, seed = jobs[model_type]
    single = _train(model_cfg, rollout, advantages, seed, "ddp", 0, 1)
    initial = _train(model_cfg, rollout, advantages, seed, "ddp", 0, 1, steps=0)
    moved = max((single["default"][k] - initial["default"][k]).abs().max().item() for k in single["default"])
    assert moved > 1e-3, "the advantages did not move the adapter: the comparison below would prove nothing"
    for strategy, rank in ((s, r) for s in ("ddp", "fsdp2") for r in (0, 1)):
        weights = torch.load(f"{out}/{model_type}.{strategy}.{rank}", weights_only=True)
        for adapter in ("default", "ema"):
            assert weights[adapter].keys() == single[adapter].keys()
            for key, value in single[adapter].items():
                where = f"{model_type} {strategy} rank {rank} {adapter} {key}"
                torch.testing.assert_close(weights[adapter][key], value, atol=1e-5, rtol=0,
                                           msg=lambda m, where=where: f"{where}: {m}")


def test_a14b_runs_cover_both_experts_then_one():
    """The A14B job's timesteps are what the docstring says (else the two-rank test would not exercise an idle
    expert), and they land on the sides the model routes them to."""
    seed = a14b_seed()
    assert set(high_noise_rows(seed, 0, SAMPLES)) == {True, False} and len(set(high_noise_rows(seed, 1, SAMPLES))) == 1
    from rlrunner.algorithms.samplers import training_grid

    assert training_grid("uniform", torch.tensor([1.0, 0.75, 0.0])).tolist() == [1.0, 0.5]  # 1.0 high, 0.5 low

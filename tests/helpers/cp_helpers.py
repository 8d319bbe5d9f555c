"""Ranks of the context-parallel tests: real ``ActorWorker`` / ``RolloutWorker`` objects in ``torch.multiprocessing``
processes joined in a gloo group, as the cluster backends start them (``MASTER_ADDR`` / ``MASTER_PORT`` set, one
process per rank). Each rank writes what the test compares to ``<out>/<name>_rank<r>.pt``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from rlrunner.step.batch import Batch
from rlrunner.step.sample_order import TrainPlan, noise_seed
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.rollout import RolloutWorker

NUM_TRAIN_STEPS = 2
PROMPTS = ['a sign that says "2345"', 'a label that reads "hi"']


def spawn(target: Any, world_size: int, *args: Any) -> None:
    """Run ``target(rank, world_size, *args)`` in ``world_size`` processes of one gloo group."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_rank, args=(target, world_size, port, *args), nprocs=world_size, join=True)


def _rank(rank: int, target: Any, world_size: int, port: int, *args: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    target(rank, world_size, *args)
    torch.distributed.destroy_process_group()


def micro_gradients(actor: ActorWorker, batch: Batch, advantages: torch.Tensor) -> dict[str, Any]:
    """The loss and the reduced LoRA gradients of one micro-batch pass: samples ``0..len(batch)-1`` at positions
    ``0..`` (seeds of their training noise), through the actor's engine as ``ActorWorker.update`` calls it."""
    micro = batch.select(list(range(len(batch))))
    micro.tensors.update(advantages=advantages, sample_index=torch.arange(len(batch)))
    actor.objective.begin_update(actor.model)
    actor.optimizer.zero_grad(set_to_none=True)
    with actor.engine.accumulate(sync=True):
        loss, _ = actor._micro_loss(micro, actor._noise_generators(micro, step=0, draw=0))
        (loss * actor.engine.gradient_scale).backward()
    grads = [torch.zeros(p.shape) if p.grad is None else p.grad for p in actor.params]
    grads = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in grads]  # FSDP2: gather the shards
    actor.optimizer.zero_grad(set_to_none=True)
    return {"loss": loss.detach(), "grads": [g.detach().clone() for g in grads]}


def train(actor: ActorWorker, batch: Batch, advantages: torch.Tensor, cfg: Any) -> dict[str, Any]:
    """``ActorWorker.update`` on the rows of the step-0 :class:`TrainPlan` of this rank's group; the adapters after."""
    plan = TrainPlan.build(cfg.runner.seed, 0, len(batch), cfg.actor.global_batch_size, actor.world_size,
                           cfg.actor.context_parallel_size)
    rank = actor.rank
    metrics = actor.update([batch], plan.samples(rank), plan.group_positions(rank), advantages[plan.samples(rank)],
                           step=0)
    return {"metrics": metrics, "adapters": actor.lora_weights()}


def actor_rank(rank: int, world_size: int, recipe: str, data: str, out: str, name: str, overrides: list[str]) -> None:
    """An actor rank of ``recipe`` (+ ``overrides``): micro-batch gradients, then one update (2 optimizer steps)."""
    cfg = OmegaConf.merge(OmegaConf.load(recipe), OmegaConf.from_dotlist(overrides))
    batch, advantages = torch.load(data, weights_only=False)
    actor = ActorWorker(cfg.actor, cfg.algorithm, NUM_TRAIN_STEPS, rank=rank, world_size=world_size)
    torch.save(actor_results(actor, batch, advantages, cfg), Path(out) / f"{name}_rank{rank}.pt")


def actor_results(actor: ActorWorker, batch: Batch, advantages: torch.Tensor, cfg: Any) -> dict[str, Any]:
    """What the CP tests compare: the gradients of one micro-batch (the first ``actor.micro_batch_size`` samples),
    then :func:`train`'s update."""
    size = cfg.actor.micro_batch_size
    return {"micro": micro_gradients(actor, batch.select(slice(0, size)), advantages[:size]),
            **train(actor, batch, advantages, cfg)}


def rollout_rank(rank: int, world_size: int, recipe: str, prompts: list[str], out: str, name: str) -> None:
    """A rollout rank in one context-parallel group of ``world_size``: its ``generate`` of step 0."""
    cfg = OmegaConf.load(recipe)
    worker = RolloutWorker(cfg.actor.model, cfg.runner.seed, algorithm_cfg=cfg.algorithm,
                           context_parallel_size=world_size, rank=rank, world_size=world_size)
    torch.save(worker.generate(prompts, cfg.algorithm.group_size, step=0, round_index=0),
               Path(out) / f"{name}_rank{rank}.pt")


def both_ranks(rank: int, world_size: int, recipe: str, data: str, prompts: list[str], out: str) -> None:
    """One process per rank for both checks of a family (each process pays its imports once)."""
    rollout_rank(rank, world_size, recipe, prompts, out, "rollout")
    actor_rank(rank, world_size, recipe, data, out, "actor", [f"actor.context_parallel_size={world_size}"])


def engines_ranks(rank: int, world_size: int, recipe: str, data: str, out: str) -> None:
    """dp × cp = 2 × 2 with DDP, then with FSDP2."""
    for strategy in ("ddp", "fsdp2"):
        actor_rank(rank, world_size, recipe, data, out, strategy,
                   ["actor.context_parallel_size=2", f"actor.strategy={strategy}"])


def rollout_refusal(rank: int, world_size: int, recipe: str, out: str) -> None:
    """A rollout rank of a CP group of ``world_size`` that writes why its set-up refused (to ``<out>/refusal_rank<r>
    .txt``; nothing when it did not)."""
    cfg = OmegaConf.load(recipe)
    try:
        RolloutWorker(cfg.actor.model, cfg.runner.seed, algorithm_cfg=cfg.algorithm,
                      context_parallel_size=world_size, rank=rank, world_size=world_size)
    except ValueError as err:
        (Path(out) / f"refusal_rank{rank}.txt").write_text(str(err))


def reference_run(cfg: Any, root: Path) -> tuple[Path, Path, Any, dict]:
    """One device: the rollout of step 0, and an actor's micro-batch gradients and update on it; the recipe and the
    rollout's batch with its advantages saved under ``root`` for the ranks."""
    rollout = RolloutWorker(cfg.actor.model, cfg.runner.seed, algorithm_cfg=cfg.algorithm).generate(
        PROMPTS, cfg.algorithm.group_size, step=0, round_index=0)
    batch = rollout.train
    chunks = batch.tensors["x0"].shape[2] if batch.tensors["x0"].dim() == 5 else 1
    advantages = torch.linspace(-1.5, 1.5, len(batch) * chunks).view(len(batch), -1).squeeze(1)
    recipe, data = root / "recipe.yaml", root / "data.pt"
    OmegaConf.save(cfg, recipe)
    torch.save((batch, advantages), data)
    actor = ActorWorker(cfg.actor, cfg.algorithm, num_train_steps=NUM_TRAIN_STEPS)
    return recipe, data, rollout, actor_results(actor, batch, advantages, cfg)


def rank_results(root: Path, name: str, world_size: int) -> dict:
    """Rank 0's result, with the metrics averaged over the ranks (as the runner reports them)."""
    results = [torch.load(root / f"{name}_rank{r}.pt", weights_only=False) for r in range(world_size)]
    metrics = {k: sum(r["metrics"][k] for r in results) / world_size for k in results[0]["metrics"]}
    return {**results[0], "metrics": metrics}


def assert_same_training(ours: dict, reference: dict) -> None:
    """The same micro-batch loss and gradients, adapters after the update and mean NFT loss (atol 1e-5)."""
    torch.testing.assert_close(ours["micro"]["loss"], reference["micro"]["loss"], rtol=0, atol=1e-5)
    assert max(g.abs().max().item() for g in reference["micro"]["grads"]) > 1e-4  # the gradients are not all zero
    for got, want in zip(ours["micro"]["grads"], reference["micro"]["grads"], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    for name, state in reference["adapters"].items():
        for key, want in state.items():
            torch.testing.assert_close(ours["adapters"][name][key], want, rtol=0, atol=1e-5, msg=f"{name} {key}")
    assert ours["metrics"]["nft_loss"] == pytest.approx(reference["metrics"]["nft_loss"], abs=1e-5)


def high_noise_rows(seed: int, step: int, samples: int) -> list[bool]:
    """Which of the step's ``samples`` positions an actor of ``seed`` trains at t = 1.0 (Wan2.2 A14B's high-noise
    expert) rather than 0.5, on the 2-step training grid ``[1.0, 0.5]``: the first draw of each sample's noise
    generator picks the index into it (``sample_xt``)."""
    return [torch.randint(0, 2, (1,), generator=torch.Generator().manual_seed(noise_seed(seed, step, p, 0))).item()
            == 0 for p in range(samples)]

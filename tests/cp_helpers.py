"""Ranks of the context-parallel tests: real ``ActorWorker`` / ``RolloutWorker`` objects in ``torch.multiprocessing``
processes joined in a gloo group, as the cluster backends start them (``MASTER_ADDR`` / ``MASTER_PORT`` set, one
process per rank). Each rank writes what the test compares to ``<out>/<name>_rank<r>.pt``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from rlrunner.step.batch import Batch
from rlrunner.step.sample_order import TrainPlan
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.rollout import RolloutWorker

NUM_TRAIN_STEPS = 2


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
    result = {"micro": micro_gradients(actor, batch.select(slice(0, 2)), advantages[:2]),
              **train(actor, batch, advantages, cfg)}
    torch.save(result, Path(out) / f"{name}_rank{rank}.pt")


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

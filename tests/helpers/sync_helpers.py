"""Ranks of the weight-sync test (tests/workers/test_weight_sync.py): FSDP2 over a gloo group of real processes
(:func:`cp_helpers.spawn`), each rank writing what the test compares to ``<out>/sync_rank<r>.pt``."""

from __future__ import annotations

from pathlib import Path
from typing import Self

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch import nn
from torch.distributed.tensor import DTensor

from rlrunner.distributed.parallelize import local_shards
from rlrunner.models import ADAPTERS, TRAINED_ADAPTER
from rlrunner.utils.flat_state import gather_flat
from rlrunner.workers.actor import ActorWorker

#: the flat path's collective under its names (all_gather_single: torch >= 2.12)
ALL_GATHERS = [name for name in ("all_gather_single", "all_gather_into_tensor") if hasattr(dist, name)]


class CollectiveCounter:
    """Counts the flat path's all-gathers (``dist.all_gather_single`` / ``all_gather_into_tensor``) and the
    per-tensor gathers (``DTensor.full_tensor``) made while it is active."""

    def __init__(self) -> None:
        self.flat = self.per_tensor = 0

    def __enter__(self) -> Self:
        self._saved = {name: getattr(dist, name) for name in ALL_GATHERS}
        self._full_tensor = DTensor.full_tensor

        def counting(original):
            def all_gather(*args, **kwargs):
                self.flat += 1
                return original(*args, **kwargs)
            return all_gather

        def full_tensor(tensor, *args, **kwargs):
            self.per_tensor += 1
            return self._full_tensor(tensor, *args, **kwargs)

        for name, original in self._saved.items():
            setattr(dist, name, counting(original))
        DTensor.full_tensor = full_tensor
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(dist, name, original)
        DTensor.full_tensor = self._full_tensor


def uneven_module() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Parameters whose rows do not split evenly over 2 ranks (3 and 1 rows: rank 1 holds 1 row and none), in
    float32 and bfloat16."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # the same values on every rank before sharding
    module = nn.Module()
    module.a = nn.Parameter(torch.randn(3, 2))
    module.b = nn.Parameter(torch.randn(1, 5))
    module.c = nn.Parameter(torch.randn(4, 3).to(torch.bfloat16))
    reference = {name: p.detach().clone() for name, p in module.named_parameters()}
    fully_shard(module)
    return module, reference


def sync_rank(rank: int, world_size: int, recipe: str, out: str) -> None:
    """An FSDP2 actor rank of the tiny recipe: both adapters (the trained one moved off the EMA one) through the flat
    gather and through the per-tensor gather, with the collectives each made; then the uneven module's gather."""
    cfg = OmegaConf.load(recipe)
    actor = ActorWorker(cfg.actor, cfg.algorithm, 2, rank=rank, world_size=world_size)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank moves its own shard
    with torch.no_grad():
        for shard in local_shards(actor.model.adapter_parameters(TRAINED_ADAPTER)):
            shard.add_(torch.randn(shard.shape, generator=gen))
    counts = {}
    flat = {}
    for name in ADAPTERS:
        with CollectiveCounter() as counter:
            flat[name] = actor.lora_weights((name,), True)
        counts[name] = (counter.flat, counter.per_tensor)
    per_tensor = {name: actor.model.lora_state_dict(name) for name in ADAPTERS}
    unpacked = actor.lora_weights()
    module, reference = uneven_module()
    with CollectiveCounter() as counter:
        uneven = gather_flat(dict(module.named_parameters()))
    torch.save({"flat": flat, "counts": counts, "per_tensor": per_tensor, "unpacked": unpacked,
                "sharded": all(isinstance(p, DTensor) for p in actor.params), "uneven": uneven,
                "uneven_reference": reference, "uneven_counts": (counter.flat, counter.per_tensor)},
               Path(out) / f"sync_rank{rank}.pt")

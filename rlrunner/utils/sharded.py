"""Whole tensors from parameters that may be sharded over ranks (FSDP2 keeps them as DTensors). Pure torch."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, distribute_tensor


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor is gathered (a collective: every rank of its group must call), others as is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def copy_full_(param: torch.Tensor, value: torch.Tensor) -> None:
    """``param.copy_(value)`` for a whole ``value``; a sharded ``param`` keeps only its own shard of it."""
    value = value.to(param.device, param.dtype)
    if isinstance(param, DTensor):  # every rank holds the whole value: cut it locally, no communication
        value = distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
    param.copy_(value)

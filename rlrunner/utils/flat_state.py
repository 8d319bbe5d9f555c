"""A state dict as one flat buffer, for the weight sync: one all-gather per adapter under FSDP2 (not one per LoRA
tensor, about 3,200 for Wan2.2-A14B), one tensor to send, unpacked on the receiving side by name and shape.

The packed form is plain values (a tensor, lists, strings), so that it also loads from a checkpoint with
``torch.load(weights_only=True)``::

    {"buffer": Tensor [total elements], "names": [str], "shapes": [[int]], "dtypes": ["float32", ...]}

``buffer`` has the promoted dtype of the tensors (float32 for LoRA adapters), so casting back is exact.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

FlatState = dict[str, Any]

FLAT_KEYS = ("buffer", "names", "shapes", "dtypes")


def is_flat(state: Any) -> bool:
    """Whether ``state`` is a :func:`pack_flat` result (not a plain name -> tensor dict)."""
    return isinstance(state, dict) and set(state) == set(FLAT_KEYS)


def _flat_state(buffer: torch.Tensor, tensors: dict[str, torch.Tensor]) -> FlatState:
    return {"buffer": buffer, "names": list(tensors), "shapes": [list(t.shape) for t in tensors.values()],
            "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors.values()]}


def _buffer_dtype(tensors: list[torch.Tensor]) -> torch.dtype:
    dtype = tensors[0].dtype if tensors else torch.float32
    for tensor in tensors[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def pack_flat(state: dict[str, torch.Tensor]) -> FlatState:
    """``state``'s (whole, local) tensors concatenated into one 1-D CPU buffer, with their names, shapes, dtypes."""
    dtype = _buffer_dtype(list(state.values()))
    parts = [t.detach().reshape(-1).to(dtype) for t in state.values()]
    if len({part.device for part in parts}) > 1:  # gathered shards on the host beside unsharded device tensors
        parts = [part.cpu() for part in parts]
    buffer = torch.cat(parts).cpu() if parts else torch.zeros(0, dtype=dtype)
    return _flat_state(buffer, state)


def unpack_flat(flat: FlatState) -> dict[str, torch.Tensor]:
    """The name -> tensor dict that :func:`pack_flat` (or :func:`gather_flat`) packed, each tensor its own copy."""
    sizes = [math.prod(shape) for shape in flat["shapes"]]
    pieces = flat["buffer"].split(sizes)
    return {name: piece.reshape(shape).to(getattr(torch, dtype)).clone()
            for name, piece, shape, dtype in zip(flat["names"], pieces, flat["shapes"], flat["dtypes"])}


def _is_row_sharded(tensor: torch.Tensor) -> bool:
    """A DTensor split by rows over a 1-D mesh (FSDP2's ``fully_shard``), the layout :func:`gather_flat` packs."""
    if not isinstance(tensor, DTensor):
        return False
    if tensor.placements == (Replicate(),):
        return False
    assert tensor.device_mesh.ndim == 1 and tensor.placements == (Shard(0),), (
        f"unexpected DTensor layout {tensor.placements} on a {tensor.device_mesh.ndim}-D mesh")
    return True


def gather_flat(state: dict[str, torch.Tensor]) -> FlatState:
    """The whole tensors of ``state`` (live parameters, some sharded by FSDP2), packed as :func:`pack_flat` does,
    with ONE all-gather for all the sharded ones: every rank pads its row shard of each tensor to
    ``ceil(rows / ranks)`` rows (a DTensor ``Shard(0)`` splits as ``torch.chunk``), concatenates them into one
    buffer of equal length on every rank, and the gathered ``[ranks, length]`` is cut back into tensors on the host.
    Every rank of the mesh must call it (each gets the result); unsharded tensors need no communication."""
    state = {name: t.detach() for name, t in state.items()}
    sharded = {name: t for name, t in state.items() if _is_row_sharded(t)}
    whole = {name: (t.to_local() if isinstance(t, DTensor) else t) for name, t in state.items() if name not in sharded}
    if sharded:
        whole.update(_gather_rows(sharded))
    return pack_flat({name: whole[name] for name in state})


def _gather_rows(sharded: dict[str, DTensor]) -> dict[str, torch.Tensor]:
    import torch.distributed as dist

    meshes = {t.device_mesh for t in sharded.values()}
    assert len(meshes) == 1, "the LoRA tensors of one adapter are sharded over one mesh"
    mesh = meshes.pop()
    ranks = mesh.size()
    dtype = _buffer_dtype(list(sharded.values()))
    padded, layout = [], []
    for tensor in sharded.values():
        local = tensor.to_local().to(dtype)
        rows = -(-tensor.shape[0] // ranks)  # ceil: torch.chunk's rows per rank
        row_size = math.prod(tensor.shape[1:])
        padded.append(local.reshape(-1))
        padded.append(local.new_zeros((rows - local.shape[0]) * row_size))
        layout.append((rows, row_size))
    local_buffer = torch.cat(padded)
    gathered = local_buffer.new_empty(ranks * local_buffer.numel())
    # all_gather_single is all_gather_into_tensor's new name (torch 2.12)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    all_gather(gathered, local_buffer, group=mesh.get_group())
    gathered = gathered.cpu().view(ranks, -1)  # cut on the host: no second device-sized buffer
    out, offset = {}, 0
    for (name, tensor), (rows, row_size) in zip(sharded.items(), layout):
        block = gathered[:, offset:offset + rows * row_size].reshape(ranks * rows, *tensor.shape[1:])
        out[name] = block[:tensor.shape[0]].to(tensor.dtype)
        offset += rows * row_size
    return out


def sync_buffer_bytes(num_elements: int, shards: int, itemsize: int = 4) -> int:
    """Device bytes one adapter's :func:`gather_flat` holds at once: its flat buffer (the gathered ``[ranks,
    length]`` of ``num_elements`` over ``shards`` ranks, padding aside) and, sharded, this rank's packed shard."""
    return num_elements * itemsize + (num_elements * itemsize // shards if shards > 1 else 0)

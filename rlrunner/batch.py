"""The one batch type that travels between workers: batch-first tensors plus per-sample metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Batch:
    """``tensors``: name → ``[B, ...]`` tensor (CPU); ``meta``: name → list of ``B`` items (e.g. prompts)."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, list[Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        for value in (*self.tensors.values(), *self.meta.values()):
            return len(value)
        return 0

    def __post_init__(self) -> None:
        sizes = {name: len(v) for name, v in (*self.tensors.items(), *self.meta.items())}
        assert len(set(sizes.values())) <= 1, f"batch fields disagree on the batch size: {sizes}"

    def select(self, index: slice | list[int] | torch.Tensor) -> Batch:
        if isinstance(index, slice):
            return Batch({k: v[index] for k, v in self.tensors.items()}, {k: v[index] for k, v in self.meta.items()})
        index = torch.as_tensor(index, dtype=torch.long)
        return Batch({k: v[index] for k, v in self.tensors.items()},
                     {k: [v[i] for i in index.tolist()] for k, v in self.meta.items()})

    def split(self, size: int) -> list[Batch]:
        """Consecutive pieces of ``size`` samples (the last may be shorter)."""
        return [self.select(slice(start, start + size)) for start in range(0, len(self), size)]

    def chunk(self, n: int) -> list[Batch]:
        """``n`` consecutive pieces of equal size (``len`` must be divisible by ``n``)."""
        assert len(self) % n == 0, f"cannot split {len(self)} samples into {n} equal parts"
        return self.split(len(self) // n)

    @staticmethod
    def cat(batches: list[Batch]) -> Batch:
        """Join along the batch. Tensors whose dim 1 differs (text conditioning of different token lengths, e.g.
        Qwen-Image's embeddings and mask) are right-padded with zeros, which their masks mark as padding."""
        first = batches[0]
        return Batch({k: _cat_padded([b.tensors[k] for b in batches]) for k in first.tensors},
                     {k: [x for b in batches for x in b.meta[k]] for k in first.meta})


def _cat_padded(tensors: list[torch.Tensor]) -> torch.Tensor:
    if tensors[0].dim() < 2 or len({t.shape[1] for t in tensors}) == 1:
        return torch.cat(tensors)
    length = max(t.shape[1] for t in tensors)
    padded = []
    for t in tensors:
        pad = t.new_zeros((t.shape[0], length - t.shape[1], *t.shape[2:]))
        padded.append(torch.cat([t, pad], dim=1))
    return torch.cat(padded)


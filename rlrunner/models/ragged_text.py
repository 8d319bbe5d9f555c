"""Text conditioning of prompts of different lengths: embeddings ``[B, L, D]`` padded to the longest prompt of the
batch, with a 0/1 mask ``[B, L]`` (Qwen-Image, Z-Image). Batches concatenate by padding to the longer text."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pad_to_length(x: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad dim 1 of ``[B, L, ...]`` to ``length``."""
    pad = [0, 0] * (x.dim() - 2) + [0, length - x.shape[1]]
    return F.pad(x, pad)


def concat_padded(conds: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate along the batch, zero-padding every tensor's dim 1 (text tokens) to the longest text."""
    length = max(next(iter(c.values())).shape[1] for c in conds)
    return {k: torch.cat([pad_to_length(c[k], length) for c in conds]) for k in conds[0]}


def stack_ragged(embeds: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``[L_i, D]`` per prompt -> embeddings ``[B, max L_i, D]`` (zero-padded) and mask ``[B, max L_i]`` int64."""
    length = max(e.shape[0] for e in embeds)
    stacked = torch.stack([pad_to_length(e[None], length)[0] for e in embeds])
    mask = torch.zeros(stacked.shape[:2], dtype=torch.long, device=stacked.device)
    for row, e in enumerate(embeds):
        mask[row, : e.shape[0]] = 1
    return stacked, mask


def unstack_ragged(embeds: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Inverse of :func:`stack_ragged`: each row's unpadded tokens ``[L_i, D]``."""
    return [row[keep.bool()] for row, keep in zip(embeds, mask)]

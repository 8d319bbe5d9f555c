"""The one batch type that travels between workers: batch-first tensors plus per-sample metadata, and tensors
shared by the samples of one prompt (text conditioning), which travel once per prompt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Batch:
    """``B`` samples.

    ``tensors``: name → ``[B, ...]`` tensor (CPU); ``meta``: name → list of ``B`` items (e.g. prompts);
    ``per_prompt``: name → ``[P, ...]`` tensor, one row per prompt (e.g. text conditioning, the same for every
    sample of a group); ``prompt_index``: int64 ``[B]``, the ``per_prompt`` row of each sample (None exactly
    when ``per_prompt`` is empty). :meth:`select` keeps only the rows its samples use, so a piece of a batch
    carries no other prompt's tensors.
    """

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, list[Any]] = field(default_factory=dict)
    per_prompt: dict[str, torch.Tensor] = field(default_factory=dict)
    prompt_index: torch.Tensor | None = None

    def __len__(self) -> int:
        for value in (*self.tensors.values(), *self.meta.values(), self.prompt_index):
            if value is not None:
                return len(value)
        return 0

    def __post_init__(self) -> None:
        sizes = {name: len(v) for name, v in (*self.tensors.items(), *self.meta.items())}
        if self.prompt_index is not None:
            sizes["prompt_index"] = len(self.prompt_index)
        assert len(set(sizes.values())) <= 1, f"batch fields disagree on the batch size: {sizes}"
        assert (self.prompt_index is None) == (not self.per_prompt), "per_prompt tensors need a prompt_index"
        rows = {name: len(v) for name, v in self.per_prompt.items()}
        assert len(set(rows.values())) <= 1, f"per-prompt fields disagree on the number of prompts: {rows}"

    @property
    def num_prompts(self) -> int:
        """Rows of the per-prompt tensors (0 without them)."""
        return next((len(v) for v in self.per_prompt.values()), 0)

    def select(self, index: slice | list[int] | torch.Tensor) -> Batch:
        """The samples ``index`` (in that order) and the per-prompt rows they use, with the index remapped."""
        if isinstance(index, slice):
            tensors = {k: v[index] for k, v in self.tensors.items()}
            meta = {k: v[index] for k, v in self.meta.items()}
        else:
            index = torch.as_tensor(index, dtype=torch.long)
            tensors = {k: v[index] for k, v in self.tensors.items()}
            meta = {k: [v[i] for i in index.tolist()] for k, v in self.meta.items()}
        if self.prompt_index is None:
            return Batch(tensors, meta)
        rows, prompt_index = torch.unique(self.prompt_index[index], sorted=True, return_inverse=True)
        return Batch(tensors, meta, {k: v[rows] for k, v in self.per_prompt.items()}, prompt_index)

    def split(self, size: int) -> list[Batch]:
        """Consecutive pieces of ``size`` samples (the last may be shorter)."""
        return [self.select(slice(start, start + size)) for start in range(0, len(self), size)]

    def per_sample(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """The per-prompt tensors expanded to one row per sample, ``[B, ...]``, on ``device``.

        The ``P`` rows move to ``device`` and are expanded there, so only one copy per prompt crosses to it.
        """
        if self.prompt_index is None:
            return {}
        index = self.prompt_index.to(device)
        return {k: v.to(device).index_select(0, index) for k, v in self.per_prompt.items()}

    @staticmethod
    def cat(batches: list[Batch]) -> Batch:
        """Join along the batch; each batch's ``prompt_index`` is offset by the prompts before it.

        Tensors whose dim 1 differs (text conditioning of different token lengths, e.g. Qwen-Image's embeddings
        and mask) are right-padded with zeros, which their masks mark as padding.
        """
        first = batches[0]
        tensors = {k: _cat_padded([b.tensors[k] for b in batches]) for k in first.tensors}
        meta = {k: [x for b in batches for x in b.meta[k]] for k in first.meta}
        if first.prompt_index is None:
            return Batch(tensors, meta)
        per_prompt = {k: _cat_padded([b.per_prompt[k] for b in batches]) for k in first.per_prompt}
        offsets, prompt_index = 0, []
        for b in batches:
            prompt_index.append(b.prompt_index + offsets)
            offsets += b.num_prompts
        return Batch(tensors, meta, per_prompt, torch.cat(prompt_index))


def _cat_padded(tensors: list[torch.Tensor]) -> torch.Tensor:
    if tensors[0].dim() < 2 or len({t.shape[1] for t in tensors}) == 1:
        return torch.cat(tensors)
    length = max(t.shape[1] for t in tensors)
    padded = []
    for t in tensors:
        pad = t.new_zeros((t.shape[0], length - t.shape[1], *t.shape[2:]))
        padded.append(torch.cat([t, pad], dim=1))
    return torch.cat(padded)

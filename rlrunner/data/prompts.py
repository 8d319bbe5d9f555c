"""Prompt datasets (one prompt per line, target text in double quotes) and the seeded prompt sampler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def load_prompts(path: str | Path, split: str) -> list[str]:
    """Prompts of ``split``: ``<path>/<split>.txt`` when ``path`` is a directory, else the file itself."""
    path = Path(path).expanduser()
    file = path / f"{split}.txt" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"prompt file {file} not found (dataset.path={str(path)!r}, split={split!r})")
    prompts = [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"prompt file {file} has no prompts")
    return prompts


class PromptSampler:
    """Draws prompt indices in shuffled epochs from a seeded generator; its state is part of the run state.

    Each call to :meth:`sample` returns ``num_prompts`` distinct-when-possible prompts, continuing through a
    permutation of the dataset and reshuffling at each epoch boundary (like a DistributedSampler with
    ``drop_last=False``, but resumable mid-epoch).
    """

    def __init__(self, prompts: list[str], seed: int) -> None:
        self.prompts = prompts
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.position = 0
        self._order = torch.randperm(len(prompts), generator=self.generator)

    def sample(self, num_prompts: int) -> list[str]:
        chosen: list[str] = []
        while len(chosen) < num_prompts:
            if self.position == len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = torch.randperm(len(self.prompts), generator=self.generator)
            take = min(num_prompts - len(chosen), len(self._order) - self.position)
            chosen += [self.prompts[i] for i in self._order[self.position:self.position + take].tolist()]
            self.position += take
        return chosen

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "epoch": self.epoch, "position": self.position,
                "order": self._order.clone(), "num_prompts": len(self.prompts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_prompts"] != len(self.prompts):
            raise ValueError(f"prompt sampler state is for {state['num_prompts']} prompts, the dataset has "
                             f"{len(self.prompts)} (different dataset?)")
        self.generator.set_state(state["generator"])
        self.epoch, self.position, self._order = state["epoch"], state["position"], state["order"].clone()

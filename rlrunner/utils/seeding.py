"""Seeds derived from (seed, role, rank, step, ...) so that any rollout or update can be replayed."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch


def derive_seed(seed: int, role: str, *indices: int) -> int:
    """A 63-bit seed that depends on every argument (stable across processes and Python versions)."""
    text = ":".join([str(seed), role, *map(str, indices)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU, plus CUDA when present) RNG states of this process, as tensors and plain
    values only, so that a checkpoint holding them loads with ``torch.load(weights_only=True)``: numpy's key array
    becomes an int64 tensor (python's state is already a tuple of ints)."""
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    numpy_state = (name, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(cached_gaussian))
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

"""Bytes a simulated step holds, by phase and category, counted on fake tensors.

:class:`MemoryTracker` is a dispatch mode stacked above torch's ``FakeTensorMode``: every tensor an op returns is
a storage the device would allocate, so the tracker keeps the live storages (freed when torch drops them) and the
peak of their sum per phase, with the categories held at that peak. A storage's category is the tracker's current
one when it is allocated (``parameters`` while the model loads, ``optimizer state`` inside the optimizer step,
``activations`` otherwise), ``communication`` for what a collective or FSDP2's all-gather writes, and
``gradients`` once the engine holds it as a parameter's ``.grad`` (:meth:`MemoryTracker.relabel`).

An op on real tensors only (the batch's indices, the device mesh's) runs for real, outside the fake mode, so
bookkeeping keeps its values. Data-dependent reads (``.item()``, ``float(tensor)``, ``.tolist()`` of a fake tensor) read 0: the simulated step
takes the path where every metric is 0 and the gradient norm is finite, so the optimizer steps.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "communication")
#: op namespaces whose outputs are communication buffers (collectives, FSDP2's all-gather copy-in and copy-out)
COMMUNICATION_NAMESPACES = ("_c10d_functional", "c10d", "fsdp", "_dtensor")
_SCALAR_READ = torch.ops.aten._local_scalar_dense.default


@dataclass
class PhasePeak:
    """The peak bytes of one phase and what they were, by category."""

    peak: int = 0
    by_category: dict[str, int] = field(default_factory=dict)


def _zero_of(tensor: torch.Tensor) -> bool | int | float:
    if tensor.dtype == torch.bool:
        return False
    return 0.0 if tensor.is_floating_point() else 0


class MemoryTracker(TorchDispatchMode):
    """Live storages and per-phase peaks of the fake tensors made under it (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._next_key = 0
        self._keys: dict[int, int] = {}  # id(storage) -> key, while the storage lives
        self._live: dict[int, tuple[int, str]] = {}  # key -> (bytes, category)
        self.totals = dict.fromkeys(CATEGORIES, 0)
        self.current = 0
        self.category = "activations"
        self.phase = "load"
        self.phases: dict[str, PhasePeak] = {}

    # ------------------------------------------------------------------ counting
    def _free(self, key: int, storage_id: int) -> None:
        nbytes, category = self._live.pop(key)
        self._keys.pop(storage_id, None)
        self.totals[category] -= nbytes
        self.current -= nbytes

    def track(self, tensor: torch.Tensor, category: str | None = None) -> None:
        """Count ``tensor``'s storage (once) in ``category`` (default: the current one); a DTensor: its shard."""
        tensor = getattr(tensor, "_local_tensor", tensor)
        if not isinstance(tensor, FakeTensor):
            return
        storage = tensor.untyped_storage()
        storage_id = id(storage)
        if storage_id in self._keys:
            if category is not None:
                self._relabel_key(self._keys[storage_id], category)
            return
        key, self._next_key = self._next_key, self._next_key + 1
        nbytes = storage.nbytes()
        label = category or self.category
        self._keys[storage_id] = key
        self._live[key] = (nbytes, label)
        self.totals[label] += nbytes
        self.current += nbytes
        weakref.finalize(storage, self._free, key, storage_id)
        self._note_peak()

    def _relabel_key(self, key: int, category: str) -> None:
        nbytes, old = self._live[key]
        if old != category:
            self._live[key] = (nbytes, category)
            self.totals[old] -= nbytes
            self.totals[category] += nbytes

    def relabel(self, tensors: list[torch.Tensor], category: str) -> None:
        """Count the storages of ``tensors`` (DTensors: their local shards) as ``category`` from now on."""
        for tensor in tensors:
            self.track(tensor, category)

    def _note_peak(self) -> None:
        record = self.phases.setdefault(self.phase, PhasePeak())
        if self.current > record.peak:
            record.peak = self.current
            record.by_category = {k: v for k, v in self.totals.items() if v}

    @contextlib.contextmanager
    def in_phase(self, phase: str, category: str = "activations") -> Iterator[None]:
        """Count the block's peak as ``phase`` (what is already live counts from the start)."""
        outer = self.phase, self.category
        self.phase, self.category = phase, category
        self.phases.setdefault(phase, PhasePeak())
        self._note_peak()
        try:
            yield
        finally:
            self.phase, self.category = outer

    @contextlib.contextmanager
    def labelled(self, category: str) -> Iterator[None]:
        """Allocations of the block count as ``category`` (the optimizer's state and its temporaries)."""
        outer, self.category = self.category, category
        try:
            yield
        finally:
            self.category = outer

    # ------------------------------------------------------------------ the dispatch mode
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's protocol)
        kwargs = kwargs or {}
        if func is _SCALAR_READ and isinstance(args[0], FakeTensor):
            return _zero_of(args[0])  # the defined path of data-dependent code (module docstring)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if inputs and not any(isinstance(t, FakeTensor) for t in inputs):
            with unset_fake_temporarily():  # real in, real out: batch bookkeeping (indices) stays real
                return func(*args, **kwargs)
        out = func(*args, **kwargs)
        communication = func.namespace in COMMUNICATION_NAMESPACES
        written = tree_flatten((out, kwargs.get("out")))[0]
        for tensor in written:
            if isinstance(tensor, torch.Tensor):
                self.track(tensor, "communication" if communication else None)
        return out

"""Bytes a simulated step holds, by phase and category, counted on fake tensors.

:class:`MemoryTracker` is a dispatch mode stacked above torch's ``FakeTensorMode``: every tensor an op returns is
a storage the device would allocate, so the tracker keeps the live storages (freed when torch drops them) and the
peak of their sum per phase, with the categories held at that peak. A storage's category is the tracker's current
one when it is allocated (``parameters`` while the model loads, ``optimizer state`` inside the optimizer step,
``activations`` otherwise), ``communication`` for what a collective or FSDP2's all-gather writes, and
``gradients`` once the engine holds it as a parameter's ``.grad`` (:meth:`MemoryTracker.relabel`).

An op on real host tensors only (the batch's indices, the device mesh's; not meta ones) runs for real, outside the fake mode, so
bookkeeping keeps its values. Data-dependent reads (``.item()``, ``float(tensor)``, ``.tolist()`` of a fake tensor) read 0: the simulated step
takes the path where every metric is 0 and the gradient norm is finite, so the optimizer steps; a mask of a fake
tensor reads all true (``nonzero``, boolean indexing), so ragged text keeps its longest length (a two-expert
denoiser's routing gets its own defined path, :mod:`rlrunner.sizing.simulate`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensor, is_fake, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "communication")
HOST = "host"  # a storage in host memory (MemoryTracker.move): kept while its tensors live, not counted
#: op namespaces whose outputs are communication buffers (collectives, FSDP2's all-gather copy-in and copy-out)
COMMUNICATION_NAMESPACES = ("_c10d_functional", "c10d", "fsdp", "_dtensor")
_SCALAR_READ = torch.ops.aten._local_scalar_dense.default
_NONZERO = torch.ops.aten.nonzero.default
_INDEX = torch.ops.aten.index.Tensor


def _is_fake_mask(index: torch.Tensor | None) -> bool:
    return isinstance(index, FakeTensor) and index.dtype == torch.bool


def _all_true_nonzero(mask: FakeTensor) -> torch.Tensor:
    """``mask.nonzero()`` read as if every element were true (a fake ``[numel, ndim]`` int64 tensor)."""
    with unset_fake_temporarily():
        every = torch.ones(mask.shape, dtype=torch.bool).nonzero()
    return mask.fake_mode.from_tensor(every)


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

    def __init__(self, count_real: bool = False) -> None:
        super().__init__()
        #: a run on real tensors (the tests' comparison with the fake one): ops run as they come, scalars read true
        self.count_real = count_real
        self._live: dict[int, list] = {}  # StorageImpl address -> [bytes, category, tracked tensors on it]
        self._tensors: set[int] = set()  # ids of the live tensors counted
        self._device_category: dict[int, str] = {}  # a storage in host memory -> its category on the device
        self._paused = False  # ops run without counting their outputs (the caller counts what it keeps)
        self.totals = dict.fromkeys(CATEGORIES, 0)
        self.current = 0
        self.flops = 0  # FLOPs of the ops run under it (torch.utils.flop_counter's formulas)
        self.category = "activations"
        self.phase = "load"
        self.phases: dict[str, PhasePeak] = {}

    # ------------------------------------------------------------------ counting
    # A storage lives while a tensor on it does: fake tensors' storage objects are not kept alive with them, so
    # each storage (keyed by its StorageImpl) counts the tracked tensors on it and is freed with the last one.
    def _release(self, key: int, tensor_id: int) -> None:
        self._tensors.discard(tensor_id)
        entry = self._live[key]
        entry[2] -= 1
        if entry[2] == 0:
            del self._live[key]
            self._device_category.pop(key, None)
            if entry[1] != HOST:
                self.totals[entry[1]] -= entry[0]
                self.current -= entry[0]

    def track(self, tensor: torch.Tensor, category: str | None = None, *, on_host: bool = False) -> None:
        """Count ``tensor``'s storage (once) in ``category`` (default: the current one); a DTensor: its shard.
        ``on_host``: a new storage starts in host memory, counted in ``category`` once :meth:`move` brings it to the
        device."""
        tensor = getattr(tensor, "_local_tensor", tensor)
        if tensor.is_meta and not is_fake(tensor):
            return  # the meta build's tensors hold nothing
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self._live:
            label = category or self.category
            if on_host:
                self._live[key] = [storage.nbytes(), HOST, 0]
                self._device_category[key] = label
            else:
                self._live[key] = [storage.nbytes(), label, 0]
                self.totals[label] += storage.nbytes()
                self.current += storage.nbytes()
                self._note_peak()
        elif category is not None:
            self._relabel_key(key, category)
        if id(tensor) not in self._tensors:
            # torch keeps a tensor's Python object alive while C++ holds the tensor only if it has Python state
            # (fake tensors are a subclass): without this a real tensor's finalizer would run too early
            tensor._simulator_counted = True
            self._tensors.add(id(tensor))
            self._live[key][2] += 1
            weakref.finalize(tensor, self._release, key, id(tensor))

    def resized(self, tensor: torch.Tensor) -> None:
        """Recount ``tensor``'s storage after an in-place resize (FSDP2 frees and re-allocates its gathered
        weights' storages so, without a new tensor)."""
        storage = tensor.untyped_storage()
        entry = self._live.get(storage._cdata)
        if entry is None:
            self.track(tensor)
            return
        change, entry[0] = storage.nbytes() - entry[0], storage.nbytes()
        self.totals[entry[1]] += change
        self.current += change
        self._note_peak()

    def _relabel_key(self, key: int, category: str) -> None:
        nbytes, old, _ = self._live[key]
        if HOST not in (old, category) and old != category:
            self._live[key][1] = category
            self.totals[old] -= nbytes
            self.totals[category] += nbytes

    def relabel(self, tensors: list[torch.Tensor], category: str) -> None:
        """Count the storages of ``tensors`` (DTensors: their local shards) as ``category`` from now on."""
        for tensor in tensors:
            self.track(tensor, category)

    def move(self, module: torch.nn.Module, *, to_host: bool) -> None:
        """Count ``module``'s parameters and buffers as in host memory (kept, not on the device) or back on the
        device in their former categories: a part the family keeps on the CPU between its uses."""
        for tensor in (*module.parameters(), *module.buffers()):
            key = getattr(tensor, "_local_tensor", tensor).untyped_storage()._cdata
            entry = self._live.get(key)
            if entry is None or (entry[1] == HOST) == to_host:
                continue
            if to_host:
                category, sign = entry[1], -1
                self._device_category[key], entry[1] = category, HOST
            else:
                category, sign = self._device_category.pop(key), 1
                entry[1] = category
            self.totals[category] += sign * entry[0]
            self.current += sign * entry[0]
        self._note_peak()

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
    def paused(self) -> Iterator[None]:
        """The block's ops run uncounted: the caller counts what it keeps (:func:`~rlrunner.sizing.fake_build.
        materialize` counts a part where it is, host memory or the device)."""
        outer, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = outer

    @contextlib.contextmanager
    def labelled(self, category: str) -> Iterator[None]:
        """Allocations of the block count as ``category`` (the optimizer's state and its temporaries)."""
        outer, self.category = self.category, category
        try:
            yield
        finally:
            self.category = outer

    # ------------------------------------------------------------------ the dispatch mode
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        if func is _SCALAR_READ and isinstance(args[0], FakeTensor):
            return _zero_of(args[0])  # the defined path of data-dependent code (module docstring)
        if func is _NONZERO and isinstance(args[0], FakeTensor):
            out = _all_true_nonzero(args[0])
            self.track(out)
            return out
        if func is _INDEX and any(_is_fake_mask(i) for i in args[1]):
            indices = [part for i in args[1] for part in (_all_true_nonzero(i).unbind(1) if _is_fake_mask(i) else [i])]
            args = (args[0], indices)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if not self.count_real and inputs and not any(is_fake(t) or t.is_meta for t in inputs):
            with unset_fake_temporarily():  # real in, real out: batch bookkeeping (indices) stays real
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
            count = flop_registry.get(func._overloadpacket)
            if count is not None:  # torch's flop counter's formulas, without its module hooks (they keep tensors)
                self.flops += int(count(*args, **kwargs, out_val=out))
        communication = func.namespace in COMMUNICATION_NAMESPACES
        written = tree_flatten((out, kwargs.get("out")))[0]
        for tensor in written:
            if isinstance(tensor, torch.Tensor):
                self.track(tensor, "communication" if communication else None)
        return out

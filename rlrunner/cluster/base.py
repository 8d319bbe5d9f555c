"""The interface every backend implements: a Cluster spawns WorkerGroups; the driver calls groups.

Single controller: only the driver calls worker groups, workers never call each other. A worker class is a
plain Python class whose public methods are its whole remote surface; its constructor is called as
``worker_cls(*args, rank=i, world_size=n, **kwargs)`` with one worker per device.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from typing_extensions import Self

from rlrunner.cluster.placement import Placement, format_devices

T = TypeVar("T")


class Handle(Generic[T]):
    """A worker's result of type ``T`` as the driver holds it: a reference, not the value (for annotations only).

    The value stays where it was computed (Ray: an ``ObjectRef`` into the object store; in-process: the object
    itself). The driver passes a handle on as an argument of another group's call, whose workers receive the ``T``
    (fetched by their own process); the driver never reads it. In signatures ``list[Handle[Batch]]`` is what the
    driver passes on and ``list[Batch]`` what a worker computes with.
    """


@dataclass(frozen=True)
class WorkerLocation:
    """Where one worker runs: one entry of ``<log_dir>/placement.json``.

    Attributes:
        component: the group's role (``actor``, ``rollout``, ``env``).
        rank: the worker's rank in its group.
        node_id: Ray's node id, or ``"local"`` for the in-process backend.
        node_ip: the node's IP address.
        device: the accelerator the worker was given, as torch names it (``"cuda:0"``, ``"npu:1"``), or
            ``"cpu"`` without one. Under Ray this is the physical id Ray assigned on that node.
    """

    component: str
    rank: int
    node_id: str
    node_ip: str
    device: str


def split_parts(result: Any, parts: Sequence[Callable[[Any], Any]]) -> tuple:
    """``result`` split into ``tuple(part(result) for part in parts)`` (see :meth:`WorkerGroup.scatter_async`)."""
    return tuple(part(result) for part in parts)


class PendingCall(abc.ABC):
    """The results of a call that is (or will be) running on every rank of a group."""

    @abc.abstractmethod
    def get(self, timeout_s: float | None = None) -> list[Any]:
        """Block until every rank has answered; one result per rank, in rank order.

        Args:
            timeout_s: seconds to wait; None uses ``cluster.worker_timeout_s``.

        Raises:
            WorkerError: the first rank that raised, died or timed out.
        """

    @abc.abstractmethod
    def done(self) -> bool:
        """True when every rank has answered (``get`` would not block)."""

    @abc.abstractmethod
    def part(self, index: int) -> PendingCall:
        """Part ``index`` of every rank's result, of a call made with ``per_rank_parts``."""

    @abc.abstractmethod
    def handles(self) -> list[Handle[Any]]:
        """One handle per rank to its result, without bringing the result to the driver.

        Pass handles as arguments of another group's call (also inside lists, tuples and dicts): the worker
        receives the values, fetched by its own process. The driver never holds the data (Ray: object
        references into Ray's object store; in-process: the values themselves).
        """


class WorkerGroup(abc.ABC):
    """The workers of one role, one per device, called together."""

    def __init__(self, role: str, devices: tuple[int, ...], locations: Sequence[WorkerLocation]) -> None:
        self.role = role
        self.devices = tuple(devices)
        self._locations = tuple(locations)
        self.node_ips = tuple(location.node_ip for location in self._locations)

    def locations(self) -> tuple[WorkerLocation, ...]:
        """Where each rank runs, in rank order (what ``placement.json`` reports)."""
        return self._locations

    @property
    def world_size(self) -> int:
        """Number of workers (ranks) in the group."""
        return len(self.devices)

    def __len__(self) -> int:
        return self.world_size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(role={self.role!r}, devices={format_devices(self.devices)!r})"

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method(*args, **kwargs)`` on every rank and wait; returns one result per rank."""
        return self.call_async(method, *args, **kwargs).get()

    def scatter(
        self, method: str, per_rank_args: Sequence[tuple], per_rank_kwargs: Sequence[dict] | None = None
    ) -> list[Any]:
        """Call ``method(*per_rank_args[i], **per_rank_kwargs[i])`` on rank ``i`` and wait for all ranks."""
        return self.scatter_async(method, per_rank_args, per_rank_kwargs).get()

    def call_rank(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on one rank only (e.g. rank 0 saves a checkpoint) and wait for its result."""
        return self.call_rank_async(rank, method, *args, **kwargs).get()[0]

    @abc.abstractmethod
    def call_async(self, method: str, *args: Any, **kwargs: Any) -> PendingCall:
        """Start ``method(*args, **kwargs)`` on every rank; ``.get()`` waits for the results."""

    @abc.abstractmethod
    def scatter_async(
        self, method: str, per_rank_args: Sequence[tuple], per_rank_kwargs: Sequence[dict] | None = None, *,
        per_rank_parts: Sequence[Sequence[Callable[[Any], Any]]] | None = None,
    ) -> PendingCall:
        """Start ``method`` on every rank with per-rank arguments; ``.get()`` waits for the results.

        ``per_rank_parts[i]``: functions (picklable) that split rank i's result, where it was computed, into
        parts kept apart (the same number for every rank): ``.part(j)`` is part j of every rank, fetched
        (``get``) or passed on to another group (``handles``) without the other parts; ``.get()`` gives each
        rank's tuple of parts.
        """

    @abc.abstractmethod
    def call_rank_async(self, rank: int, method: str, *args: Any, **kwargs: Any) -> PendingCall:
        """Start ``method`` on rank ``rank`` only; ``.get()`` returns a one-element list."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop the group's workers and free their devices (idempotent)."""

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"{self.role} has ranks 0..{self.world_size - 1}, got rank {rank}")

    def _per_rank(
        self, method: str, per_rank_args: Sequence[tuple], per_rank_kwargs: Sequence[dict] | None,
        per_rank_parts: Sequence[Sequence[Callable]] | None = None,
    ) -> list[tuple[tuple, dict]]:
        """Validate scatter arguments: one tuple of args (and optionally one dict of kwargs, one list of at least
        two part functions, the same number for every rank) per rank."""
        kwargs_list = list(per_rank_kwargs) if per_rank_kwargs is not None else [{}] * self.world_size
        if per_rank_parts is not None and (len({len(p) for p in per_rank_parts}) != 1 or len(per_rank_parts[0]) < 2):
            raise ValueError(f"{self.role}.{method}: per_rank_parts must give every rank the same number (>= 2) "
                             f"of part functions, got {[len(p) for p in per_rank_parts]}")
        checked = [("per_rank_args", per_rank_args), ("per_rank_kwargs", kwargs_list)]
        for name, items in checked + ([("per_rank_parts", per_rank_parts)] if per_rank_parts is not None else []):
            if len(items) != self.world_size:
                raise ValueError(
                    f"{self.role}.{method}: {name} has {len(items)} entries for {self.world_size} ranks; "
                    f"give exactly one per rank"
                )
        for rank, args in enumerate(per_rank_args):
            if not isinstance(args, tuple):
                raise TypeError(
                    f"{self.role}.{method}: per_rank_args[{rank}] must be a tuple of arguments, got "
                    f"{type(args).__name__} (write (x,) for a single argument)"
                )
        return [(tuple(a), dict(k)) for a, k in zip(per_rank_args, kwargs_list)]


class Cluster(abc.ABC):
    """Where workers run. Create with :func:`rlrunner.cluster.create_cluster`; use as a context manager."""

    def __init__(self, placement: Placement, device_type: str, worker_timeout_s: float) -> None:
        self.placement = placement
        self.device_type = device_type
        self.worker_timeout_s = float(worker_timeout_s)
        self._groups: list[WorkerGroup] = []
        self._closed = False

    @abc.abstractmethod
    def spawn(self, role: str, worker_cls: type, devices: tuple[int, ...], *args: Any, **kwargs: Any) -> WorkerGroup:
        """Start one ``worker_cls`` per device in ``devices``.

        Each worker is built as ``worker_cls(*args, rank=i, world_size=len(devices), **kwargs)`` after its
        torch.distributed env vars are set. Returns once every constructor has finished.

        Raises:
            WorkerError: a constructor raised, a worker died, or construction took longer than
                ``cluster.worker_timeout_s``.
        """

    @property
    def groups(self) -> tuple[WorkerGroup, ...]:
        """Groups spawned and not yet shut down."""
        return tuple(self._groups)

    def shutdown(self) -> None:
        """Stop every worker and release the cluster's resources (idempotent, safe after Ctrl-C)."""
        if self._closed:
            return
        self._closed = True
        self.stop_workers()
        self._release()

    def stop_workers(self) -> None:
        """Stop every group's workers and keep the cluster: :meth:`rejoin` then makes room for new ones."""
        for group in reversed(list(self._groups)):
            group.shutdown()
        self._groups.clear()

    def rejoin(self, timeout_s: float) -> None:
        """After :meth:`stop_workers`: wait (at most ``timeout_s``) until the cluster can hold the placement again
        (a lost node back, or another in its place) and take its resources. In-process: nothing to wait for.

        Raises:
            PlacementError: the placement did not fit the cluster within ``timeout_s``.
        """

    def _release(self) -> None:
        """Backend-specific clean-up after all groups are stopped."""

    def _forget(self, group: WorkerGroup) -> None:
        """Called by a group that shut itself down."""
        if group in self._groups:
            self._groups.remove(group)

    def _check_spawn(self, role: str, worker_cls: type, devices: tuple[int, ...]) -> tuple[int, ...]:
        if self._closed:
            raise RuntimeError("the cluster is shut down; create a new one")
        if not isinstance(worker_cls, type):
            raise TypeError(f"spawn({role!r}): worker_cls must be a class, got {type(worker_cls).__name__}")
        devices = tuple(int(d) for d in devices)
        if not devices:
            raise ValueError(f"spawn({role!r}): no devices given")
        if len(set(devices)) != len(devices):
            raise ValueError(f"spawn({role!r}): devices {devices} repeat a device; one worker per device")
        for d in devices:
            self.placement.node_of(d)
        return devices

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

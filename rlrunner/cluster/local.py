"""The in-process backend (``cluster.backend: local``): workers are plain objects in the driver's process.

Same calls as the Ray backend, no serialization. Calls run eagerly and in rank order when they are made
(``call_async`` returns an already finished :class:`PendingCall`), so runs are deterministic and a debugger
steps straight into worker code. All ranks share one process, so ``init_distributed`` with more than one
rank refuses to run here.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from rlrunner.cluster.base import Cluster, PendingCall, WorkerGroup, WorkerLocation, split_parts
from rlrunner.cluster.errors import WorkerError, last_line
from rlrunner.cluster.placement import Placement, parse_placement
from rlrunner.cluster.resources import detect_device_type, detect_devices_per_node
from rlrunner.distributed.process_group import IN_PROCESS_ENV, find_free_port, worker_env

LOCAL_IP = "127.0.0.1"
LOCAL_NODE_ID = "local"  # what placement.json names the driver's machine


class LocalPendingCall(PendingCall):
    """A finished call: the results, or the first rank's error."""

    def __init__(self, results: list[Any], error: WorkerError | None = None) -> None:
        self._results = results
        self._error = error

    def get(self, timeout_s: float | None = None) -> list[Any]:
        if self._error is not None:
            raise self._error
        return list(self._results)

    def done(self) -> bool:
        return True

    def part(self, index: int) -> PendingCall:
        return LocalPendingCall([r[index] for r in self._results], self._error)

    def handles(self) -> list[Any]:
        return self.get()  # in-process, a handle is the value itself


class LocalWorkerGroup(WorkerGroup):
    """Workers of one role living in the driver's process."""

    def __init__(self, cluster: LocalCluster, role: str, devices: tuple[int, ...], workers: list[Any]) -> None:
        device = _driver_device(cluster.device_type)
        super().__init__(role, devices, [WorkerLocation(role, rank, LOCAL_NODE_ID, LOCAL_IP, device)
                                         for rank in range(len(devices))])
        self._cluster = cluster
        self.workers = workers  # the worker objects themselves, for tests and debugging

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> PendingCall:
        return self._run(method, [(rank, args, kwargs) for rank in range(self.world_size)])

    def scatter_async(
        self, method: str, per_rank_args: Sequence[tuple], per_rank_kwargs: Sequence[dict] | None = None, *,
        per_rank_parts: Sequence[Sequence[Callable[[Any], Any]]] | None = None,
    ) -> PendingCall:
        per_rank = self._per_rank(method, per_rank_args, per_rank_kwargs, per_rank_parts)
        return self._run(method, [(rank, a, k) for rank, (a, k) in enumerate(per_rank)], per_rank_parts)

    def call_rank_async(self, rank: int, method: str, *args: Any, **kwargs: Any) -> PendingCall:
        self._check_rank(rank)
        return self._run(method, [(rank, args, kwargs)])

    def shutdown(self) -> None:
        self.workers = []
        self._cluster._forget(self)

    def _run(self, method: str, calls: list[tuple[int, tuple, dict]], parts: Sequence | None = None) -> PendingCall:
        if not self.workers:
            raise RuntimeError(f"the {self.role} group is shut down")
        results = []
        for rank, args, kwargs in calls:
            fn = getattr(self.workers[rank], method, None)
            if fn is None or not callable(fn) or method.startswith("_"):
                raise AttributeError(f"{type(self.workers[rank]).__name__} has no public method {method!r}")
            try:
                result = fn(*args, **kwargs)
                results.append(result if parts is None else split_parts(result, parts[rank]))
            except Exception as exc:  # noqa: BLE001  (reported as WorkerError, like the Ray backend)
                text = traceback.format_exc()
                error = WorkerError(self.role, rank, LOCAL_IP, f"raised in {method!r}: {last_line(text)}", text)
                error.__cause__ = exc
                return LocalPendingCall([], error)
        return LocalPendingCall(results)


class LocalCluster(Cluster):
    """Runs every worker in this process. For tests and debugging; the placement is checked but not enforced."""

    def __init__(self, cluster_cfg: Any, placement: Placement | None = None) -> None:
        if placement is None:
            n_per_node = detect_devices_per_node(cluster_cfg)
            placement = parse_placement(cluster_cfg.component_placement, cluster_cfg.num_nodes, n_per_node)
        super().__init__(placement, detect_device_type(), getattr(cluster_cfg, "worker_timeout_s", 1800.0))

    def spawn(self, role: str, worker_cls: type, devices: tuple[int, ...], *args: Any, **kwargs: Any) -> WorkerGroup:
        devices = self._check_spawn(role, worker_cls, devices)
        world_size, port = len(devices), find_free_port()
        workers = []
        for rank in range(world_size):
            env = worker_env(rank, world_size, rank, world_size, LOCAL_IP, port)
            with _environ({**env, IN_PROCESS_ENV: "1"}):
                try:
                    workers.append(worker_cls(*args, rank=rank, world_size=world_size, **kwargs))
                except Exception as exc:  # reported as WorkerError, like the Ray backend
                    text = traceback.format_exc()
                    what = f"raised in '{worker_cls.__name__}.__init__': {last_line(text)}"
                    raise WorkerError(role, rank, LOCAL_IP, what, text) from exc
        group = LocalWorkerGroup(self, role, devices, workers)
        self._groups.append(group)
        return group


def _driver_device(device_type: str) -> str:
    """The device in-process workers compute on: the driver's current accelerator, or ``"cpu"``."""
    if device_type == "cpu":
        return "cpu"
    return f"{device_type}:{getattr(torch, device_type).current_device()}"


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """Set env vars for the duration of a block, then restore the previous values."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old

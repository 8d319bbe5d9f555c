"""How many CPU threads a worker may run: its Ray CPU reservation (``cluster.cpus_per_worker``), not the node's cores.

Ray does not narrow a worker's affinity mask, so ``os.sched_getaffinity`` shows every core of the node: 8 env
workers on a 128-core node would each size their OCR engines for 128. The cluster backend therefore passes each
worker its reservation before the worker is built (:func:`thread_env`, applied by :func:`apply_thread_budget`),
and everything that sizes a thread pool asks :func:`worker_cpus`. No Ray here.
"""

from __future__ import annotations

import os

# the CPUs the cluster reserved for this worker's process; unset outside a cluster worker
WORKER_CPUS_ENV = "RLRUNNER_WORKER_CPUS"


def thread_env(cpus_per_worker: float) -> dict[str, str]:
    """Env vars that size a worker of ``cpus_per_worker`` reserved CPUs (none when it reserves none: a GPU worker
    with ``cpus_per_worker: 0`` keeps the defaults)."""
    if cpus_per_worker <= 0:
        return {}
    threads = str(max(1, int(cpus_per_worker)))
    return {WORKER_CPUS_ENV: threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def apply_thread_budget() -> None:
    """Size torch's intra-op pool to :func:`worker_cpus` when the cluster set a reservation (OpenMP runtimes that
    start later read ``OMP_NUM_THREADS`` themselves)."""
    if os.environ.get(WORKER_CPUS_ENV):
        import torch

        torch.set_num_threads(worker_cpus())


def worker_cpus() -> int:
    """CPUs this process may keep busy: the cluster's reservation (:data:`WORKER_CPUS_ENV`), else the cores it may
    run on (affinity mask)."""
    reserved = os.environ.get(WORKER_CPUS_ENV)
    if reserved:
        return max(1, int(reserved))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

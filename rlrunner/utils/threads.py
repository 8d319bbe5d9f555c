"""How many CPU threads a worker may run: its Ray CPU reservation (``cluster.cpus_per_worker``), not the node's cores;
an env worker with ``cluster.env_threads: node`` its share of the node's CPUs that the other workers leave.

Ray does not narrow a worker's affinity mask, so ``os.sched_getaffinity`` shows every core of the node: 8 env
workers on a 128-core node would each size their OCR engines for 128. The cluster backend therefore passes each
worker its budget before the worker is built (:func:`thread_env`, applied by :func:`apply_thread_budget`),
and everything that sizes a thread pool asks :func:`worker_cpus`. A one-CPU reservation leaves CPU OCR one thread
per env worker (8 threads score for a whole 8-GPU node), hence :func:`node_share_threads`. No Ray here.
"""

from __future__ import annotations

import os

# the CPUs the cluster reserved for this worker's process; unset outside a cluster worker
WORKER_CPUS_ENV = "RLRUNNER_WORKER_CPUS"
# cluster.env_threads: what an env worker's threads are sized from (its reservation, or its share of the node)
ENV_THREADS = ("reserved", "node")


def thread_env(cpus_per_worker: float) -> dict[str, str]:
    """Env vars that size a worker of ``cpus_per_worker`` reserved CPUs (none when it reserves none: a GPU worker
    with ``cpus_per_worker: 0`` keeps the defaults)."""
    if cpus_per_worker <= 0:
        return {}
    threads = str(max(1, int(cpus_per_worker)))
    return {WORKER_CPUS_ENV: threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def node_share_threads(node_cpus: float, env_workers: int, other_workers: int, cpus_per_worker: float) -> int:
    """Threads of each of ``env_workers`` env workers on a node of ``node_cpus`` CPUs: what the node's
    ``other_workers`` (actor, rollout) leave after their ``cpus_per_worker`` each, shared evenly; never fewer than
    the env worker's own reservation, nor than 1. E.g. 128 CPUs, 8 env + 16 other workers of 1 CPU: 14 each."""
    left = node_cpus - other_workers * cpus_per_worker
    return max(1, int(cpus_per_worker), int(left // max(1, env_workers)))


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

"""What a worker call raises when a worker fails: it raised, died, did not answer in time, or a collective failed.
The driver's recovery (:mod:`rlrunner.run.recovery`) judges a failure by these types, never by message text.
"""

from __future__ import annotations


class WorkerError(RuntimeError):
    """A worker failed: it raised, died, or did not answer in time.

    The message names the role, rank, node IP and the underlying error (with the worker's traceback text
    when it raised). The parts are kept as attributes for programmatic use.
    """

    def __init__(self, role: str, rank: int, node_ip: str, what: str, detail: str = "") -> None:
        self.role, self.rank, self.node_ip, self.what, self.detail = role, rank, node_ip, what, detail
        super().__init__(f"{self.summary}:\n{detail.rstrip()}" if detail else self.summary)

    @property
    def summary(self) -> str:
        """One line: which worker (role, rank, node IP) and what happened to it."""
        return f"{self.role} worker rank {self.rank} on {self.node_ip} {self.what}"

    def __reduce__(self) -> tuple:
        return type(self), (self.role, self.rank, self.node_ip, self.what, self.detail)


class WorkerLost(WorkerError):
    """A worker is gone: its process exited or was killed, its node died, or a result it needed was lost with
    another worker. The run can go on from its last checkpoint on new workers (``runner.max_restarts``)."""


class WorkerTimedOut(WorkerError):
    """A worker did not answer within ``cluster.worker_timeout_s`` (hung, or stuck on a dead peer)."""


class CollectiveFailed(WorkerError):
    """A worker's torch.distributed collective or rendezvous failed or timed out (a peer rank is gone or hung)."""


def last_line(text: str) -> str:
    """The last non-empty line of a traceback: the exception type and message."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""

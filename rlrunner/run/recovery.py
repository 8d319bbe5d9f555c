"""When a failed run may go on by itself (``runner.max_restarts``): pure bookkeeping, no Ray and no I/O.

A failure is judged by its exception's type, never by the text of Ray's message: a lost worker or node, a worker
that hung past ``cluster.worker_timeout_s`` and a failed collective are cured by new workers resuming from the last
complete checkpoint; anything else (a worker's code raised, a user error, a checkpoint that does not load) would
fail again the same way, so it ends the run. So does a failure at the same step as the one before it (the step
itself breaks the workers: a restart would loop), and one more than ``runner.max_restarts`` allows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rlrunner.cluster.errors import CollectiveFailed, WorkerError, WorkerLost, WorkerTimedOut

# exception type -> the cause a restart record names; a type not here is not cured by a restart
RECOVERABLE: dict[type[WorkerError], str] = {
    WorkerLost: "worker_lost",
    WorkerTimedOut: "worker_timeout",
    CollectiveFailed: "collective_failed",
}


def failure_cause(error: BaseException) -> str | None:
    """The cause (a value of :data:`RECOVERABLE`) of an ``error`` that new workers can cure; None otherwise."""
    return next((cause for kind, cause in RECOVERABLE.items() if isinstance(error, kind)), None)


@dataclass
class Restart:
    """One restart, as ``<log_dir>/restarts.jsonl`` records it.

    Attributes:
        number: 1 for the run's first restart.
        cause: :func:`failure_cause` of the error.
        exception: the error's type name (``WorkerLost``, ...).
        worker: which worker failed and how (the error's one-line summary).
        node: the IP of the failed worker's node.
        step_failed_at: the global step in progress when it failed (steps count from 1).
        step_resumed_from: the step of the checkpoint the run went on from (0: none yet, from the start).
        lost_steps: finished steps that were not checkpointed and are computed again.
        seconds: from the failure to the new workers' resumed state (teardown, rejoin, start, resume).
    """

    number: int
    cause: str
    exception: str
    worker: str
    node: str
    step_failed_at: int
    step_resumed_from: int = 0
    lost_steps: int = 0
    seconds: float = 0.0

    def record(self) -> dict:
        return asdict(self)

    def line(self, max_restarts: int) -> str:
        """The console line of this restart."""
        return (f"rlrunner: restart {self.number}/{max_restarts}: {self.worker} ({self.exception}) in step "
                f"{self.step_failed_at}; went on from step {self.step_resumed_from} on new workers after "
                f"{self.seconds:.1f} s, {self.lost_steps} finished step(s) lost")


class RestartPolicy:
    """Decides, failure by failure, whether the run restarts (``runner.max_restarts``; 0: never)."""

    def __init__(self, max_restarts: int) -> None:
        if max_restarts < 0:
            raise ValueError(f"runner.max_restarts must be >= 0 (0 = stop at the first failure), got {max_restarts}")
        self.max_restarts = max_restarts
        self.restarts: list[Restart] = []
        self.refusal = ""  # why the last failure ended the run, when a restart could have cured it

    def admit(self, error: BaseException, step_failed_at: int) -> Restart | None:
        """A new :class:`Restart` (counted) when ``error`` in global step ``step_failed_at`` may be cured by a
        restart; None when the run must stop (:attr:`refusal` says why, unless the error is not a curable kind)."""
        self.refusal = ""
        cause = failure_cause(error)
        if cause is None:
            return None
        if len(self.restarts) >= self.max_restarts:
            self.refusal = (f"not restarting: runner.max_restarts={self.max_restarts} restart(s) spent"
                            if self.max_restarts else "")
            return None
        if self.restarts and self.restarts[-1].step_failed_at == step_failed_at:
            self.refusal = (f"not restarting: step {step_failed_at} failed again after a restart (the step itself "
                            "breaks the workers)")
            return None
        restart = Restart(len(self.restarts) + 1, cause, type(error).__name__, getattr(error, "summary", str(error)),
                          getattr(error, "node_ip", ""), step_failed_at)
        self.restarts.append(restart)
        return restart

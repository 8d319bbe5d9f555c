"""A run that outlives its workers: a lost worker or node, a hung call or a failed collective costs the steps since
the last complete checkpoint, not the run (``runner.max_restarts``, :mod:`rlrunner.run.recovery`).

The driver tears the worker groups down, waits (``cluster.rejoin_timeout_s``) until the cluster can hold the
placement again, starts new workers and resumes them from the run's newest complete checkpoint (none yet: the
checkpoint it started from, or step 0), which gives the adapters of an uninterrupted run. The trackers stay open
across restarts: one tracker run per run. Each restart is a console line, ``recovery/*`` metrics and a line of
``<log_dir>/restarts.jsonl``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rlrunner.cluster import Cluster
from rlrunner.run.checkpoint_index import restart_point
from rlrunner.run.outcome import ending_error, run_outcome
from rlrunner.run.recovery import Restart, RestartPolicy
from rlrunner.tracking.logger import RunLogger

RESTARTS_FILE = "restarts.jsonl"


class Supervised(Protocol):
    """What the supervisor asks of a runner (:class:`rlrunner.run.runner.Runner`)."""

    step: int
    saved_step: int  # the newest complete checkpoint's step (this run's, or the one it resumed); -1: none
    run_logger: RunLogger

    def fit(self) -> None: ...

    def abandon(self) -> None: ...

    def close(self, status: str) -> None: ...


# (resume_dir, the trackers to keep writing to or None) -> a runner with started workers, resumed and logging
StartRunner = Callable[[str, "RunLogger | None"], Supervised]


def supervise(cluster: Cluster, cfg: Any, log_dir: Path, start: StartRunner,
              stop_requested: Callable[[], str] = lambda: "") -> None:
    """Train to the end, restarting on new workers after each curable failure (but not once a signal asked the run
    to stop: ``stop_requested``, the signal's name); always close the trackers with the run's status (finished,
    preempted, failed: :func:`~rlrunner.run.outcome.run_outcome`) and let the error that ended the run propagate:
    a worker failure after a stop signal as :class:`~rlrunner.run.preemption.WorkersStopped`, caused by it."""
    policy = RestartPolicy(cfg.runner.max_restarts)
    resume_dir, run_logger, restart, failed_at = cfg.runner.resume_dir, None, None, 0.0
    while True:
        runner = None
        try:
            runner = start(resume_dir, run_logger)
            run_logger = runner.run_logger
            if restart is not None:
                report_restart(restart, runner, time.monotonic() - failed_at, log_dir, policy.max_restarts)
            runner.fit()
        except BaseException as error:
            failed_at = time.monotonic()
            step = runner.step + 1 if runner is not None else (restart.step_failed_at if restart else 1)
            stopping = stop_requested()  # a signal that reached the workers too is no failure to cure
            restart = None if stopping else policy.admit(error, step)
            if restart is None:
                if policy.refusal:
                    print(f"rlrunner: {policy.refusal}", file=sys.stderr)
                steps = (runner.step, runner.saved_step) if runner is not None else (None, -1)
                ending = ending_error(error, stopping, *steps)
                _close(runner, run_logger, run_outcome(ending).status)
                if ending is error:
                    raise
                raise ending from error
            restart.lost_steps = runner.step if runner is not None else 0  # less the resumed step, once known
            try:
                cluster.stop_workers()  # first: a driver thread waiting on a dead worker's peers returns now
                if runner is not None:
                    runner.abandon()
                cluster.rejoin(cfg.cluster.rejoin_timeout_s)
            except BaseException as rejoin_error:  # the cluster did not come back: the run ends here
                _close(None, run_logger, run_outcome(rejoin_error).status)
                raise
            resume_dir = restart_point(log_dir, cfg.runner.resume_dir)
            continue
        runner.close(run_outcome(None).status)
        return


def report_restart(restart: Restart, runner: Supervised, seconds: float, log_dir: Path, max_restarts: int) -> None:
    """Complete ``restart`` with where ``runner`` went on from, then log it: console, metrics, restarts.jsonl."""
    restart.step_resumed_from, restart.seconds = runner.step, round(seconds, 3)
    restart.lost_steps = max(restart.lost_steps - runner.step, 0)
    print(restart.line(max_restarts), file=sys.stderr)
    runner.run_logger.replay_from(runner.step)  # the steps after it are computed again: logged once, never dropped
    runner.run_logger.scalars({"recovery/restarts": restart.number, "recovery/lost_steps": restart.lost_steps,
                               "recovery/seconds": restart.seconds}, runner.step)
    with open(log_dir / RESTARTS_FILE, "a") as file:
        file.write(json.dumps(restart.record()) + "\n")


def _close(runner: Supervised | None, run_logger: RunLogger | None, status: str) -> None:
    """Close the runner (its workers' files, then its trackers), or only the trackers of a runner that never
    started."""
    if runner is not None:
        runner.close(status)
    elif run_logger is not None:
        run_logger.close(status)

"""How a run ended, decided in one place: the error it ended with (None: it did not) and the stop signal pending
then give one :class:`Outcome`: the status the trackers record, the launcher's exit status and its last line.

The supervisor closes the trackers with :attr:`Outcome.status` and the launcher (``rlrunner.commands.train``) exits
with :attr:`Outcome.exit_code` after printing :attr:`Outcome.message`; nothing else decides how a run ended. The
exit statuses (docs/runs.md "Preemption and recovery"):

* 0: finished;
* 1: a worker raised, died or hung and ``runner.max_restarts`` restarts did not help;
* 2: a user error (recipe, checkpoint, placement, a node that cannot run the workers): one line;
* 3: a required reward could not score (``runner.max_reward_error_steps``, or its service is down at start);
* 4: preempted: a stop signal ended the run, at a step boundary with a checkpoint, or in the step in flight when
  the workers got the signal too (the newest complete checkpoint stands): relaunch with ``runner.resume_dir=auto``;
* 5: the reward-hacking watch's alarm stopped the run (``runner.watch.action: stop``), with a checkpoint:
  look at the saved samples, then relaunch with ``runner.resume_dir=auto`` to go on (docs/reward_hacking.md);
* 130: a second signal (or ``runner.save_on_signal: false``) stopped the run at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlrunner.cluster import NodeSetupError, PlacementError, WorkerError
from rlrunner.config.loader import RecipeError
from rlrunner.rewards import RewardUnavailable
from rlrunner.run.checkpoint import CheckpointError
from rlrunner.run.preemption import FAILED, FINISHED, PREEMPTED, Preempted, WorkersStopped
from rlrunner.run.recovery import failure_cause
from rlrunner.run.watch import WatchStopped

EXIT_FINISHED = 0
EXIT_WORKER_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_REWARD_UNAVAILABLE = 3
EXIT_PREEMPTED = 4
EXIT_WATCH_STOPPED = 5
EXIT_INTERRUPTED = 130

USER_ERRORS = (RecipeError, CheckpointError, PlacementError, NodeSetupError)


@dataclass(frozen=True)
class Outcome:
    """How a run ended: ``status`` as the trackers record it (finished, failed, preempted), the launcher's
    ``exit_code``, its last line ``message`` and ``detail``, printed before it (a worker's own traceback, or Ray's
    account of how its process ended). An empty ``message`` after an error (a bug of the driver's own) means the
    launcher lets the error propagate: its traceback says more than one line could."""

    status: str
    exit_code: int
    message: str = ""
    detail: str = ""


def ending_error(error: BaseException, stop_signal: str, step: int | None, saved_step: int) -> BaseException:
    """The error a run ends with: ``error`` itself, except a worker failure of a kind new workers would cure
    (:func:`~rlrunner.run.recovery.failure_cause`) while the stop signal ``stop_signal`` was pending: the workers got
    the signal too, so that is a preemption in the step in flight (:class:`WorkersStopped`, ``step`` steps finished,
    None: while the workers started; ``saved_step``: the newest complete checkpoint's, -1: none)."""
    if stop_signal and isinstance(error, WorkerError) and failure_cause(error) is not None:
        return WorkersStopped(stop_signal, step, saved_step, error.summary)
    return error


def run_outcome(error: BaseException | None) -> Outcome:
    """The :class:`Outcome` of a run that ended with ``error`` (None: it finished); pass it through
    :func:`ending_error` first where a stop signal may have been pending."""
    if error is None:
        return Outcome(FINISHED, EXIT_FINISHED)
    if isinstance(error, Preempted):
        return Outcome(PREEMPTED, EXIT_PREEMPTED, f"rlrunner: {error}")
    if isinstance(error, WatchStopped):  # the run is sound but its reward is being gamed: resumable, not finished
        return Outcome(FAILED, EXIT_WATCH_STOPPED, f"rlrunner: {error}")
    if isinstance(error, KeyboardInterrupt):
        return Outcome(PREEMPTED, EXIT_INTERRUPTED,
                       "rlrunner: interrupted; workers stopped (last complete checkpoint is kept)")
    if isinstance(error, USER_ERRORS):
        return Outcome(FAILED, EXIT_USER_ERROR, f"rlrunner: error: {error}")
    if isinstance(error, RewardUnavailable):  # no sample could be scored for runner.max_reward_error_steps steps
        return Outcome(FAILED, EXIT_REWARD_UNAVAILABLE, f"rlrunner: error: {error}")
    if isinstance(error, WorkerError):
        if RewardUnavailable.__name__ in error.what:  # a required reward service is down at start: one line says it
            return Outcome(FAILED, EXIT_REWARD_UNAVAILABLE, f"rlrunner: error: {error.summary}")
        return Outcome(FAILED, EXIT_WORKER_FAILED, f"rlrunner: error: {error.summary}; all workers stopped "
                       "(runner.resume_dir=auto resumes from the last complete checkpoint)", error.detail.rstrip())
    return Outcome(FAILED, EXIT_WORKER_FAILED)  # the driver's own bug: its traceback propagates, as Python prints it

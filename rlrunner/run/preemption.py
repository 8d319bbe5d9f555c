"""Preemption (``runner.save_on_signal``): SIGTERM or SIGINT asks the run to stop after its current step, with a
checkpoint; a second signal stops it at once.

Schedulers give a job a grace period between SIGTERM and SIGKILL (Slurm ``--signal``, Kubernetes
``terminationGracePeriodSeconds``): the first signal only sets a flag, which the runner reads between steps; there
it saves and raises :class:`Preempted`, and the launcher exits with its own status (docs/runs.md "Preemption and
recovery"). A second signal raises ``KeyboardInterrupt`` wherever the driver is. When the signal reached the workers
too, the step in flight fails with them: the supervisor ends the run with :class:`WorkersStopped`
(:func:`rlrunner.run.outcome.ending_error`), also a preemption.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType

from typing_extensions import Self

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# how a run ended, as the trackers record it (RunLogger.close); rlrunner.run.outcome decides which
FINISHED, FAILED, PREEMPTED = "finished", "failed", "preempted"
RELAUNCH = "relaunch the same command with runner.resume_dir=auto to go on"


class Preempted(Exception):
    """The run stopped at a step boundary because a signal asked it to; ``checkpoint`` holds its state (None: there
    was nothing new to save, the newest checkpoint already holds ``step``)."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path | None) -> None:
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        saved = f"checkpoint saved to {checkpoint}" if checkpoint else "its last checkpoint holds it"
        super().__init__(f"stopped by {signal_name} after step {step} ({saved}); {RELAUNCH}")


class WorkersStopped(Preempted):
    """The stop signal reached the workers too (Slurm's GraceTime, ``scancel`` without ``-b``, a process group's
    Ctrl-C): the step in flight died with them, ``worker`` says how, and nothing could be saved. ``step`` steps had
    finished (None: the workers died while starting); the newest complete checkpoint holds ``saved_step`` (-1: none
    yet), and the finished steps after it are lost (:attr:`lost_steps`)."""

    def __init__(self, signal_name: str, step: int | None, saved_step: int, worker: str) -> None:
        self.signal_name, self.step, self.checkpoint, self.worker = signal_name, step, None, worker
        self.saved_step, self.lost_steps = saved_step, 0 if step is None else step - max(saved_step, 0)
        if step is None:  # nothing trained yet by these workers: the checkpoint they were to resume stands
            where, kept = "while the workers started", "nothing was trained since the checkpoint it started from"
        else:
            held = f"the newest complete checkpoint holds step {saved_step}" if saved_step >= 0 else "no checkpoint yet"
            where, kept = f"in step {step + 1}", f"{held}, {self.lost_steps} finished step(s) lost"
        Exception.__init__(self, f"stopped by {signal_name} {where}: the workers got the signal too ({worker}); "
                                 f"{kept}; {RELAUNCH}")


class StopSignals:
    """While entered (and ``enabled``), the first SIGTERM/SIGINT sets :attr:`received` instead of killing the
    driver; the second raises ``KeyboardInterrupt``. Signals can only be caught in the main thread: elsewhere
    (a driver run from a thread) nothing changes."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.received = ""  # the first signal's name, e.g. "SIGTERM"
        self._previous: dict[int, object] = {}

    def __call__(self) -> str:
        """The name of the signal that asked the run to stop, or ``""``."""
        return self.received

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received:
            raise KeyboardInterrupt(f"second stop signal ({name})")
        self.received = name
        # a raw write: the handler may interrupt a print that holds sys.stderr's lock
        os.write(2, f"\nrlrunner: {name} received: stopping after the current step with a checkpoint (send it "
                    "again to stop at once)\n".encode())

    def __enter__(self) -> Self:
        if self.enabled and threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

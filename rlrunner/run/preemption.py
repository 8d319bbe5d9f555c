"""Preemption (``runner.save_on_signal``): SIGTERM or SIGINT asks the run to stop after its current step, with a
checkpoint; a second signal stops it at once.

Schedulers give a job a grace period between SIGTERM and SIGKILL (Slurm ``--signal``, Kubernetes
``terminationGracePeriodSeconds``): the first signal only sets a flag, which the runner reads between steps; there
it saves and raises :class:`Preempted`, and the launcher exits with its own status (README "Preemption and
recovery"). A second signal raises ``KeyboardInterrupt`` wherever the driver is.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType

from typing_extensions import Self

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# how a run ended, as the trackers record it (RunLogger.close)
FINISHED, FAILED, PREEMPTED = "finished", "failed", "preempted"


class Preempted(Exception):
    """The run stopped at a step boundary because a signal asked it to; ``checkpoint`` holds its state (None: there
    was nothing new to save, the newest checkpoint already holds ``step``)."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path | None) -> None:
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        saved = f"checkpoint saved to {checkpoint}" if checkpoint else "its last checkpoint holds it"
        super().__init__(f"stopped by {signal_name} after step {step} ({saved}); relaunch the same command with "
                         "runner.resume_dir=auto to go on")


def run_status(error: BaseException | None) -> str:
    """How a run that ended with ``error`` (None: it did not) is recorded: finished, preempted (a signal stopped
    it, saved or not) or failed."""
    if error is None:
        return FINISHED
    return PREEMPTED if isinstance(error, (Preempted, KeyboardInterrupt)) else FAILED


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

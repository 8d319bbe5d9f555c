"""How a run ended, from hand-made endings: the trackers' status, the exit status and the last line come from one
function, and a worker lost while a stop signal is pending is a preemption (exit 4), not a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlrunner.cluster import CollectiveFailed, PlacementError, WorkerError, WorkerLost, WorkerTimedOut
from rlrunner.config.loader import RecipeError
from rlrunner.rewards import RewardUnavailable
from rlrunner.run.checkpoint import CheckpointError
from rlrunner.run.outcome import Outcome, ending_error, run_outcome
from rlrunner.run.preemption import Preempted, WorkersStopped
from rlrunner.run.watch import WatchStopped

LOST = WorkerLost("actor", 0, "10.0.0.7", "died during 'update' (its process exited or was killed)")
RELAUNCH = "relaunch the same command with runner.resume_dir=auto to go on"


def test_each_ending_has_its_status_exit_code_and_line():
    saved = Path("/logs/run/checkpoints/global_step_3")
    assert run_outcome(None) == Outcome("finished", 0)
    assert run_outcome(Preempted("SIGTERM", 3, saved)) == Outcome(
        "preempted", 4, f"rlrunner: stopped by SIGTERM after step 3 (checkpoint saved to {saved}); {RELAUNCH}")
    assert run_outcome(KeyboardInterrupt()) == Outcome(
        "preempted", 130, "rlrunner: interrupted; workers stopped (last complete checkpoint is kept)")
    for user_error in (RecipeError("bad key"), CheckpointError("bad key"), PlacementError("bad key")):
        assert run_outcome(user_error) == Outcome("failed", 2, "rlrunner: error: bad key")
    assert run_outcome(RewardUnavailable("no sample scored")) == Outcome("failed", 3,
                                                                         "rlrunner: error: no sample scored")
    down = WorkerError("env", 0, "10.0.0.7", "raised in '__init__': RewardUnavailable: service down")
    assert run_outcome(down) == Outcome(
        "failed", 3, "rlrunner: error: env worker rank 0 on 10.0.0.7 raised in '__init__': RewardUnavailable: "
                     "service down")
    raised = WorkerError("actor", 1, "10.0.0.7", "raised in 'update': KeyError", "Traceback ...\nKeyError: 'x'\n")
    assert run_outcome(raised) == Outcome(
        "failed", 1, "rlrunner: error: actor worker rank 1 on 10.0.0.7 raised in 'update': KeyError; all workers "
                     "stopped (runner.resume_dir=auto resumes from the last complete checkpoint)",
        "Traceback ...\nKeyError: 'x'")
    # the driver's own bug: failed, with no line of ours, so the launcher lets its traceback through
    assert run_outcome(RuntimeError("driver bug")) == Outcome("failed", 1)


def test_a_worker_lost_while_a_stop_signal_is_pending_is_a_preemption_that_says_what_was_lost():
    ending = ending_error(LOST, "SIGTERM", step=7, saved_step=5)
    assert isinstance(ending, WorkersStopped) and (ending.lost_steps, ending.saved_step) == (2, 5)
    assert run_outcome(ending) == Outcome(
        "preempted", 4, "rlrunner: stopped by SIGTERM in step 8: the workers got the signal too (actor worker rank 0 "
                        "on 10.0.0.7 died during 'update' (its process exited or was killed)); the newest complete "
                        f"checkpoint holds step 5, 2 finished step(s) lost; {RELAUNCH}")
    never_saved = run_outcome(ending_error(LOST, "SIGINT", step=2, saved_step=-1))
    assert never_saved.exit_code == 4 and "in step 3: " in never_saved.message
    assert "; no checkpoint yet, 2 finished step(s) lost; " in never_saved.message
    starting = run_outcome(ending_error(LOST, "SIGTERM", step=None, saved_step=-1))
    assert starting.exit_code == 4 and starting.message.startswith("rlrunner: stopped by SIGTERM while the workers "
                                                                   "started: the workers got the signal too (")
    assert "; nothing was trained since the checkpoint it started from; " in starting.message
    for curable in (WorkerTimedOut("env", 0, "n", "did not finish 'collect'"),
                    CollectiveFailed("actor", 1, "n", "raised in 'update': DistBackendError")):
        assert run_outcome(ending_error(curable, "SIGTERM", 1, 1)).exit_code == 4


@pytest.mark.parametrize("error", [LOST, WorkerError("actor", 0, "n", "raised in 'update': KeyError"),
                                   RecipeError("bad"), RuntimeError("driver bug")])
def test_without_a_stop_signal_or_with_an_error_of_its_own_the_run_ends_with_that_error(error):
    assert ending_error(error, "", 3, 2) is error
    if error is not LOST:  # a worker whose own code raised (or a bug) is no signal's doing
        assert ending_error(error, "SIGTERM", 3, 2) is error


def test_a_run_the_reward_hacking_watch_stopped_exits_5_with_its_checkpoint_and_how_to_go_on():
    saved = Path("/logs/run/checkpoints/global_step_10")
    outcome = run_outcome(WatchStopped(10, saved, "guard eval_reward fell 0.7590 -> 0.0212"))
    assert (outcome.status, outcome.exit_code) == ("failed", 5)
    assert outcome.message == (f"rlrunner: the reward-hacking watch stopped the run after step 10 (guard eval_reward "
                               f"fell 0.7590 -> 0.0212; checkpoint saved to {saved}); look at the saved samples "
                               f"(docs/reward_hacking.md), then {RELAUNCH}")

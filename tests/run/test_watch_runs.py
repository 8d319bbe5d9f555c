"""The reward-hacking watch on a run that games its reward: the CPU model trained on ``jpeg_compressibility`` (flat
images compress best) with the eval reward left as OCR. Issue 43 measured the training reward 0.44 -> 0.83 while
the held-out OCR fell 0.759 -> 0.022 by step 10; the watch must fire within 40 steps and stop the run with its exit
status and a checkpoint (``runner.watch.action: stop``). That ``runner.resume_dir=auto`` goes on from there, in
alarm, is checked in seconds on a scripted reward (tests/run/test_watch_stop.py)."""

import json
from pathlib import Path

import pytest

from rlrunner.run.outcome import EXIT_WATCH_STOPPED
from tests.commands.test_launcher import launch

HACKED = ("env.train.reward.model=jpeg_compressibility", "env.eval.total_num_envs=32", "runner.val_check_interval=5",
          "runner.save_interval=0", "runner.sample_log_interval=0", "runner.watch.action=stop")


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_watch_stops_a_gamed_run_with_a_checkpoint(tmp_path):
    stopped = launch(*HACKED, "runner.max_steps=40", log_root=tmp_path, timeout=1200)
    assert stopped.returncode == EXIT_WATCH_STOPPED, stopped.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    alarms = {r["step"]: r["watch/alarm"] for r in records(run_dir) if "watch/alarm" in r}
    fired = min(step for step, alarm in alarms.items() if alarm == 1)
    assert 0 < fired <= 40 and set(alarms) == set(range(0, fired + 1, 5)), alarms  # 0 or 1 at every eval
    assert (run_dir / "checkpoints" / f"global_step_{fired}").is_dir()
    assert (run_dir / "samples" / f"watch_alarm_samples_step{fired:06d}.png").is_file()
    alarm = [line for line in stopped.stderr.splitlines() if "reward-hacking watch:" in line]
    assert len(alarm) == 1 and "guard eval_reward fell 0.7" in alarm[0], alarm
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rlrunner: the reward-hacking watch stopped the run after step {fired} ") and \
           "runner.resume_dir=auto" in last, last

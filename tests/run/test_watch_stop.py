"""The watch's stop through the runner and the training command, in seconds: a scripted reward games the run for
sure (the training reward rises with every call, the eval reward falls), so the alarm, the stop's checkpoint, exit
status 5 and the resume that goes on are checked without training a gamed run for minutes
(tests/run/test_watch_runs.py keeps one real gamed run, in the slow tier)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from runner_helpers import SMALL_OVERRIDES, make_assets

from rlrunner.commands.train import main
from rlrunner.rewards.image_stats import PixelReward
from rlrunner.rewards.registry import REWARDS
from rlrunner.run.outcome import EXIT_FINISHED, EXIT_WATCH_STOPPED

#: batches scored so far, per scripted reward, over every run of a test: a resumed run goes on where it stopped
CALLS: dict[str, int] = {}


class ScriptedReward(PixelReward):
    """Every image of the n-th batch scores ``start + change * n`` (clipped to [0, 1])."""

    start, change = 0.0, 0.0

    def score(self, image: np.ndarray) -> float:
        raise AssertionError("scored by batch")

    def score_batch(self, images: np.ndarray, prompts: list[str], reasons: list[str | None]) -> np.ndarray:
        key = type(self).__name__
        CALLS[key] = CALLS.get(key, 0) + 1
        return np.full(len(images), np.clip(self.start + self.change * CALLS[key], 0.0, 1.0), dtype=np.float32)


class Rising(ScriptedReward):
    start, change = 0.3, 0.05


class Falling(ScriptedReward):  # 0.8, 0.55, 0.3, ...: down by more than half at the third eval
    start, change = 1.05, -0.25


@pytest.fixture
def scripted_rewards(monkeypatch):
    monkeypatch.setitem(REWARDS, "scripted_rising", Rising)
    monkeypatch.setitem(REWARDS, "scripted_falling", Falling)
    CALLS.clear()


def _train(root: Path, name: str, *overrides: str) -> int:
    model, data = make_assets(root) if not (root / "model").exists() else (root / "model", root / "data")
    return main(["--config-name", "tiny_nft_ocr", "--log-dir", str(root / "logs" / name), *SMALL_OVERRIDES,
                 f"actor.model.model_path={model}", f"env.train.dataset.path={data}", f"env.eval.dataset.path={data}",
                 f"runner.logger.log_path={root / 'logs'}", "env.train.reward.model=scripted_rising",
                 "env.eval.reward.model=scripted_falling", "runner.val_check_interval=1", "runner.save_interval=0",
                 "runner.watch.action=stop", "runner.watch.window=1", *overrides])


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_watch_stops_a_scripted_gamed_run_with_a_checkpoint_and_resume_goes_on(tmp_path, scripted_rewards,
                                                                                  capsys):
    assert _train(tmp_path, "stopped", "runner.max_steps=6") == EXIT_WATCH_STOPPED
    stderr = capsys.readouterr().err
    run_dir = tmp_path / "logs" / "stopped"
    alarms = {r["step"]: r["watch/alarm"] for r in _records(run_dir) if "watch/alarm" in r}
    fired = min(step for step, alarm in alarms.items() if alarm == 1)
    # window 1: the training reward has risen once there are 2 steps; the eval reward has fallen by more than half
    # of its first value by the third eval (step 2)
    assert fired == 2 and alarms == {0: 0.0, 1: 0.0, 2: 1.0}, alarms
    assert (run_dir / "checkpoints" / f"global_step_{fired}").is_dir()
    assert (run_dir / "samples" / f"watch_alarm_samples_step{fired:06d}.png").is_file()
    alarm = [line for line in stderr.splitlines() if "reward-hacking watch:" in line]
    held_out = {r["step"]: r["eval/avg"] for r in _records(run_dir) if "eval/avg" in r}
    assert len(alarm) == 1 and f"guard eval_reward fell {held_out[0]:.4f} -> {held_out[fired]:.4f}" in alarm[0], alarm
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"rlrunner: the reward-hacking watch stopped the run after step {fired} ") and \
           "runner.resume_dir=auto" in last, last

    # resumed in alarm, the run goes on (only a new alarm stops it again) to its end
    assert _train(tmp_path, "resumed", f"runner.max_steps={fired + 2}", "runner.val_check_interval=2",
                  "runner.resume_dir=auto") == EXIT_FINISHED
    stderr = capsys.readouterr().err
    assert f"resumed from {run_dir / 'checkpoints' / f'global_step_{fired}'} at step {fired}" in stderr
    evals = [r for r in _records(tmp_path / "logs" / "resumed") if "watch/alarm" in r]
    assert [r["step"] for r in evals] == [fired + 2] and evals[0]["watch/alarm"] == 1  # step-0 values kept
    assert "the watch's alarm fired" not in stderr  # this run's own summary: no new alarm

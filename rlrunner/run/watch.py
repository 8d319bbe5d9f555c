"""The reward-hacking watch (``runner.watch``, docs/reward_hacking.md), as the driver keeps it: the training reward of
every step and each guard's value at every eval, the alarm (:class:`~rlrunner.algorithms.watch.AlarmRule`) and what
it does when it fires: one console line, the eval's samples saved, a record for the closing summary
(:data:`~rlrunner.tracking.console.WATCH_FILE`) and, with ``action: stop``, the end of the run with a checkpoint.

The guards: the eval reward when it differs from the training reward (``eval_reward``: ``eval/avg``), the eval's
sample diversity (``diversity``: ``eval/diversity``, relative to the first eval) and each ``runner.watch.guards``
entry (``eval/guard/<name>``, scored on the env workers: :mod:`rlrunner.workers.guards`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rlrunner.algorithms.watch import AlarmRule, diversity
from rlrunner.rewards import RewardOutput
from rlrunner.run.preemption import RELAUNCH
from rlrunner.step.batch import Batch
from rlrunner.tracking.console import WATCH_FILE
from rlrunner.tracking.logger import RunLogger
from rlrunner.workers.guards import FEATURES, GUARD_ERRORS, GUARD_PREFIX


class WatchStopped(Exception):
    """``runner.watch.action: stop``: the alarm fired at the eval after ``step`` and the run stopped there;
    ``checkpoint`` holds its state (None: the newest checkpoint already does)."""

    def __init__(self, step: int, checkpoint: Path | None, alarm: str) -> None:
        self.step, self.checkpoint = step, checkpoint
        saved = f"checkpoint saved to {checkpoint}" if checkpoint else "its last checkpoint holds it"
        super().__init__(f"the reward-hacking watch stopped the run after step {step} ({alarm}; {saved}); look at "
                         f"the saved samples (docs/reward_hacking.md), then {RELAUNCH}")


class Watch:
    """The watch of one run; :meth:`state_dict` goes into every checkpoint, so a resumed run keeps its step-0
    values. ``cfg``: the whole recipe (the watch compares the splits' rewards); ``log_dir``: the run's folder."""

    def __init__(self, cfg: DictConfig, log_dir: Path) -> None:
        watch = cfg.runner.watch
        self.enabled, self.action, self.log_dir = watch.enabled, watch.action, log_dir
        self.rule = AlarmRule(watch.max_drop, watch.min_reward_rise, watch.window)
        train, evaluation = (OmegaConf.to_container(cfg.env[s].reward, resolve=True) for s in ("train", "eval"))
        self.builtin = [name for name, on in (("eval_reward", train != evaluation), ("diversity", watch.diversity))
                        if on]
        self.train_rewards: list[float] = []  # env/avg of each step
        self.values: dict[str, list[float]] = {}  # guard -> its value at each eval it was scored at
        self.alarm = False  # the last eval's watch/alarm
        self.reported: set[str] = set()  # guards whose failure was reported (once each)
        self.stop_alarm = ""  # the alarm line, when action stop and the alarm fired anew at this eval

    def state_dict(self) -> dict[str, Any]:
        return {"train_rewards": self.train_rewards, "values": self.values, "alarm": self.alarm,
                "reported": sorted(self.reported)}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict`'s (None, a checkpoint from before the watch: the next eval is the first)."""
        if state:
            self.train_rewards, self.values = list(state["train_rewards"]), dict(state["values"])
            self.alarm, self.reported = state["alarm"], set(state["reported"])

    def train_reward(self, value: float) -> None:
        if self.enabled:
            self.train_rewards.append(value)

    def guard_values(self, reward: RewardOutput) -> dict[str, float]:
        """This eval's value of each guard that scored (a failed one is reported once, one line, and skipped)."""
        for line in reward.extra.get(GUARD_ERRORS, []):
            name, why = line.split(": ", 1)
            if name not in self.reported:
                self.reported.add(name)
                tqdm.write(f"rlrunner: warning: watch guard {name} could not score ({why}); the watch goes on "
                           f"without it (runner.watch.guards)", file=sys.stderr)
        values = {key.removeprefix(GUARD_PREFIX): float(v.mean()) for key, v in reward.extra.items()
                  if key.startswith(GUARD_PREFIX)}
        if "eval_reward" in self.builtin:
            values["eval_reward"] = float(reward.avg.mean())
        features = reward.extra.get(FEATURES)
        if "diversity" in self.builtin and features is not None and len(features) >= 2:
            values["diversity"] = diversity(torch.as_tensor(features), group_size=1)  # one sample per prompt
        return values

    def at_eval(self, step: int, reward: RewardOutput, logged: Batch, run_logger: RunLogger) -> dict[str, float]:
        """Score this eval's guards, decide the alarm and act on it; returns the metrics to log."""
        if not self.enabled:
            return {}
        values = self.guard_values(reward)
        for name, value in values.items():
            self.values.setdefault(name, []).append(value)
        metrics = {f"eval/guard/{name}": value for name, value in values.items() if name not in self.builtin}
        if "diversity" in values:
            first = self.values["diversity"][0]
            metrics["eval/diversity"] = values["diversity"] / first if first > 0 else 1.0
        fired = [name for name in values if self.rule.fires(self.train_rewards, self.values[name])]
        metrics["watch/alarm"] = float(bool(fired))
        if fired and not self.alarm:  # a new alarm: a run resumed in alarm goes on until it clears and fires again
            line = self.alarm_line(fired[0])
            path = self.save_samples(step, fired[0], reward, logged, run_logger)
            tqdm.write(f"rlrunner: WARNING: reward-hacking watch: {line}; samples: {path or 'none logged'}",
                       file=sys.stderr)
            self.record(step, fired[0], path)
            self.stop_alarm = line if self.action == "stop" else ""
        self.alarm = bool(fired)
        return metrics

    def alarm_line(self, name: str) -> str:
        guard, k = self.values[name], min(self.rule.window, len(self.train_rewards))
        rewards = sum(self.train_rewards[:k]) / k, sum(self.train_rewards[-k:]) / k
        return (f"guard {name} fell {guard[0]:.4f} -> {guard[-1]:.4f} since the first eval while the training "
                f"reward rose {rewards[0]:.4f} -> {rewards[1]:.4f}")

    def save_samples(self, step: int, name: str, reward: RewardOutput, logged: Batch,
                     run_logger: RunLogger) -> Path | None:
        """The eval's logged samples, captioned with the fired guard's score (the eval reward's for the built-in
        guards), as ``samples/watch_alarm_samples_step<N>.png`` beside the run's other sample grids."""
        n = len(logged)
        if n == 0:
            return None
        scores = reward.extra.get(GUARD_PREFIX + name, reward.avg.reshape(len(reward.avg), -1).mean(axis=1))
        texts = reward.recognised_texts()
        return run_logger.samples("watch/alarm_samples", logged.tensors["images"].numpy(), logged.meta["prompts"],
                                  scores[:n], step, texts=None if texts is None else texts[:n])

    def record(self, step: int, name: str, samples: Path | None) -> None:
        values = self.values[name]
        entry = {"step": step, "guard": name, "first": values[0], "now": values[-1], "action": self.action,
                 "samples": str(samples) if samples else None}
        with open(self.log_dir / WATCH_FILE, "a") as file:
            file.write(json.dumps(entry) + "\n")

    def stop_if_fired(self, step: int, save: Any) -> None:
        """With ``action: stop`` and a new alarm at this step's eval: ``save()`` (None: nothing new to save) and
        raise :class:`WatchStopped`."""
        if self.stop_alarm:
            alarm, self.stop_alarm = self.stop_alarm, ""
            raise WatchStopped(step, save() if save else None, alarm)

"""The reward-hacking watch's share of an env worker: the eval reward, then each guard (``runner.watch.guards``) on
the same samples, and the samples' pixel features for the driver's diversity measure (docs/reward_hacking.md).

A guard that cannot be built (its service down at start, its model missing), raises or scores no sample is left out
from then on; its error travels to the driver in the output
(``watch/guard_errors``, one ``"<name>: <error>"`` each), which reports it once. The eval reward itself is never
touched: a guard cannot change ``eval/avg``.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from rlrunner.algorithms.watch import sample_features
from rlrunner.rewards import Reward, RewardOutput, build_reward
from rlrunner.rewards.registry import score

GUARD_PREFIX = "guard/"  # RewardOutput.extra key of a guard's per-sample scores: guard/<name>, float32 [B]
FEATURES = "watch/features"  # float32 [B, D]: sample_features of each sample
GUARD_ERRORS = "watch/guard_errors"  # the guards left out, as "<name>: <error>" lines


def _error_line(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"


def build_guards(watch_cfg: Any) -> list[tuple[str, Reward | str]]:
    """``(name, reward)`` of each guard of ``runner.watch.guards`` (already checked: rlrunner.run.checks); a guard
    that cannot be built has its error line in place of the reward."""
    guards: list[tuple[str, Reward | str]] = []
    for guard in watch_cfg.guards:
        settings = {key: value for key, value in dict(guard).items() if key != "name"}
        try:
            guards.append((str(guard["name"]), build_reward(settings)))
        except Exception as error:  # noqa: BLE001  a guard never stops the run
            guards.append((str(guard["name"]), _error_line(error)))
    return guards


class WatchedReward(Reward):
    """``reward``'s output, with each guard's scores and the samples' features beside it in ``extra``."""

    def __init__(self, reward: Reward, guards: list[tuple[str, Reward | str]], features: bool) -> None:
        super().__init__(reward.spec)
        self.reward, self.features = reward, features
        self.guards = [(name, guard) for name, guard in guards if isinstance(guard, Reward)]
        self.name, self.uses_metadata = reward.name, reward.uses_metadata
        # guard name -> its first error
        self.broken: dict[str, str] = {name: guard for name, guard in guards if isinstance(guard, str)}
        self._lock = threading.Lock()

    def __call__(self, images: np.ndarray, prompts: list[str], metadata: list[dict] | None = None) -> RewardOutput:
        out = score(self.reward, images, prompts, metadata)
        extra = dict(out.extra)
        for name, guard in self.guards:
            if name in self.broken:
                continue
            try:
                guarded = score(guard, images, prompts, metadata)
                mask = guarded.extra.get("error_mask")
                if guarded.failure or (mask is not None and len(mask) and np.all(mask)):  # nothing it could score
                    raise RuntimeError(guarded.failure or f"no sample could be scored ({guarded.errors} errors)")
                extra[GUARD_PREFIX + name] = np.asarray(guarded.avg, np.float32).reshape(len(images), -1).mean(1)
            except Exception as error:  # noqa: BLE001  a guard never stops the eval; the driver says why once
                with self._lock:
                    self.broken.setdefault(name, _error_line(error))
        extra[GUARD_ERRORS] = [f"{name}: {why}" for name, why in self.broken.items()]
        if self.features:
            extra[FEATURES] = sample_features(torch.from_numpy(np.ascontiguousarray(images))).numpy()
        return RewardOutput(out.avg, out.parts, out.errors, extra, out.failure)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._lock = threading.Lock()

"""What the driver logs besides scalars: each split's reward metrics and the sample grids (and videos) of the
training and eval rollouts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlrunner.rewards import RewardOutput
from rlrunner.step.batch import Batch
from rlrunner.tracking.logger import RunLogger


def reward_metrics(prefix: str, reward: RewardOutput) -> dict[str, float]:
    """A split's (``prefix``: ``env`` or ``eval``) mean reward, its scoring errors and each reward's mean."""
    return {f"{prefix}/avg": float(reward.avg.mean()), f"{prefix}/reward_errors": float(reward.errors),
            **{f"{prefix}/{name}": value for name, value in reward.metrics().items()}}


def logs_samples_at(interval: int, step: int) -> bool:
    """Whether the training samples of global step ``step`` (counted from 1) are written to the logs, every
    ``interval`` (``runner.sample_log_interval``) steps and at the first."""
    return interval > 0 and (step % interval == 0 or step == 1)


def log_samples(run_logger: RunLogger, env_cfg: Any, log_dir: Path, tag: str, logged: Batch, reward: RewardOutput,
                step: int) -> None:
    """Write the ``logged`` samples (the first of the rollout) with their rewards (``reward``: all samples); videos
    also as files where the split's ``env.<split>.video_cfg.save_video`` asks (``env_cfg``: the recipe's ``env``)."""
    n = len(logged)
    images = logged.tensors["images"].numpy()
    per_sample = reward.avg.reshape(len(reward.avg), -1).mean(axis=1)
    texts = reward.recognised_texts()  # what the OCR read: beside the target, it shows reward hacking
    run_logger.samples(tag, images, logged.meta["prompts"], per_sample[:n], step,
                       texts=None if texts is None else texts[:n])
    if images.ndim == 5:
        video_cfg = env_cfg["eval" if tag.startswith("eval") else "train"].video_cfg
        out_dir = None
        if video_cfg.save_video:
            out_dir = Path(video_cfg.video_base_dir) if video_cfg.video_base_dir else log_dir / "videos"
        run_logger.videos(tag, images, step, video_cfg.fps, out_dir)

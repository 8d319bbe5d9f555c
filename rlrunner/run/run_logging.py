"""What the driver logs besides scalars: each split's reward metrics and the sample grids (and videos) of the
training and eval rollouts; methods of :class:`~rlrunner.run.runner.Runner`, which holds the recipe, the step and
the trackers."""

from __future__ import annotations

from pathlib import Path

from rlrunner.rewards import RewardOutput
from rlrunner.step.batch import Batch


class RunLogging:
    """Logging methods of :class:`~rlrunner.run.runner.Runner` (its ``cfg``, ``step``, ``log_dir``, ``run_logger``)."""

    @staticmethod
    def reward_metrics(prefix: str, reward: RewardOutput) -> dict[str, float]:
        return {f"{prefix}/avg": float(reward.avg.mean()), f"{prefix}/reward_errors": float(reward.errors),
                **{f"{prefix}/{name}": value for name, value in reward.metrics().items()}}

    def logs_samples_at(self, step: int) -> bool:
        """Whether the training samples of global step ``step`` (counted from 1) are written to the logs."""
        interval = self.cfg.runner.sample_log_interval
        return interval > 0 and (step % interval == 0 or step == 1)

    def log_samples(self, tag: str, logged: Batch, reward: RewardOutput) -> None:
        """Write the ``logged`` samples (the first of the rollout) with their rewards (``reward``: all samples)."""
        n = len(logged)
        images = logged.tensors["images"].numpy()
        per_sample = reward.avg.reshape(len(reward.avg), -1).mean(axis=1)
        texts = reward.recognised_texts()  # what the OCR read: beside the target, it shows reward hacking
        self.run_logger.samples(tag, images, logged.meta["prompts"], per_sample[:n], self.step,
                                texts=None if texts is None else texts[:n])
        if images.ndim == 5:
            video_cfg = self.cfg.env["eval" if tag.startswith("eval") else "train"].video_cfg
            out_dir = None
            if video_cfg.save_video:
                out_dir = Path(video_cfg.video_base_dir) if video_cfg.video_base_dir else self.log_dir / "videos"
            self.run_logger.videos(tag, images, self.step, video_cfg.fps, out_dir)

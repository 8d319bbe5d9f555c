"""One logger interface for the run: TensorBoard, ``metrics.jsonl``, sample grids and videos on disk."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from rlrunner.tracking.backends import GLOBAL_STEP, TRACKERS, open_trackers

METRICS_FILE = "metrics.jsonl"


class StepTimer:
    """Named phase timers of one step: ``with timer("rollout"): ...`` → ``time/rollout`` seconds."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"time/{phase}": value for phase, value in self.seconds.items()}


def _target(prompt: str) -> str:
    """The quoted target of a prompt (what the OCR reward looks for), else the prompt's start."""
    parts = prompt.split('"')
    return parts[1] if len(parts) >= 3 else prompt[:24]


def caption_lines(prompt: str, reward: float, read: str | None, width_chars: int) -> list[str]:
    """Under a sample: its target and what the reward read (when the reward reports it), then the reward."""
    lines = [f"target: {_target(prompt)!r}"]
    if read is not None:
        lines.append(f"read: {read!r}")
    lines.append(f"reward: {reward:.2f}")
    return [line[:width_chars] for line in lines]


def sample_grid(images: np.ndarray, prompts: list[str], rewards: np.ndarray, title: str = "",
                texts: list[str] | None = None, columns: int = 4) -> np.ndarray:
    """Tile uint8 ``[N, H, W, 3]`` images under a ``title`` line (e.g. the split and step), with a caption under each
    image (:func:`caption_lines`: target, ``texts[i]`` as read by the OCR when given, reward); ``[H', W', 3]``."""
    n, height, width = images.shape[:3]
    scale = max(1, 128 // max(height, 1))  # tiny images are enlarged so their captions stay readable
    tile_w, tile_h, line_h = width * scale, height * scale, 12
    caption_h = line_h * (3 if texts is not None else 2) + 4
    title_h = line_h + 6 if title else 0
    columns = max(1, min(columns, n))
    rows = math.ceil(n / columns)
    grid = Image.new("RGB", (columns * tile_w, title_h + rows * (tile_h + caption_h)), "white")
    draw, font = ImageDraw.Draw(grid), ImageFont.load_default()
    if title:
        draw.text((2, 3), title, fill="black", font=font)
    width_chars = max(8, tile_w // 6)  # the default font is about 6 pixels wide per character
    for i in range(n):
        x, y = (i % columns) * tile_w, title_h + (i // columns) * (tile_h + caption_h)
        tile = Image.fromarray(images[i]).resize((tile_w, tile_h), Image.NEAREST)
        grid.paste(tile, (x, y))
        lines = caption_lines(prompts[i], float(rewards[i]), None if texts is None else texts[i], width_chars)
        for k, line in enumerate(lines):
            draw.text((x + 2, y + tile_h + 2 + k * line_h), line, fill="black", font=font)
    return np.asarray(grid)


def _replayed(record: dict, step: int) -> bool:
    """Whether a run that goes on from training step ``step`` logs ``record`` (a metrics.jsonl line) again."""
    return record["step"] > step or record["step"] == step == 0 and not any(k.startswith("recovery/") for k in record)


# runner.logger.logger_backends: metrics.jsonl and samples/ are always written; these are the optional ones
LOGGER_BACKENDS = ("tensorboard", *TRACKERS)


class RunLogger:
    """Writes scalars to TensorBoard, the trackers and ``metrics.jsonl``; images to them and ``samples/``; videos
    to TensorBoard.

    Steps: ``metrics.jsonl``, TensorBoard and the sample files keep the training step. The trackers get a logging
    step that never goes back (wandb drops what is logged at a step it has passed): the training step, until an
    in-run restart replays steps (:meth:`replay_from`); from there on, one past the highest they were given, while
    the training step travels as the metric ``global_step`` (wandb's x axis).

    ``cfg`` is the recipe's ``runner.logger`` (:class:`~rlrunner.config.schema.LoggerConfig`): its
    ``logger_backends``, and the ``project_name``/``experiment_name`` of the run in the trackers (wandb, swanlab,
    mlflow); ``config`` is the resolved recipe they record with it.
    """

    def __init__(self, log_dir: Path, cfg: Any, config: dict | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.writer = None
        if "tensorboard" in cfg.logger_backends:
            self.writer = self._open_tensorboard()
        self.trackers = open_trackers(list(cfg.logger_backends), self.log_dir, cfg.project_name,
                                      cfg.experiment_name or self.log_dir.name, config or {})
        self.jsonl = self._open_jsonl()
        (self.log_dir / "samples").mkdir(exist_ok=True)
        self.tracker_offset, self.tracker_step = 0, -1  # logging step = training step + offset; the highest given

    def _open_tensorboard(self, purge_step: int | None = None) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.log_dir / "tensorboard"), purge_step=purge_step)

    def _open_jsonl(self) -> TextIO:
        return open(self.log_dir / METRICS_FILE, "a", buffering=1)  # closed in close() and replay_from()

    def _to_tracker_step(self, step: int) -> int:
        self.tracker_step = max(self.tracker_step, step + self.tracker_offset)
        return step + self.tracker_offset

    def replay_from(self, step: int) -> None:
        """A restarted run goes on from training step ``step``: the records it will compute again (the steps after
        ``step``, lost with the workers; at step 0 also step 0's eval, ``runner.val_before_train``) leave
        ``metrics.jsonl``, so each step keeps one line of each kind, the replayed one; the restarts' own
        ``recovery/*`` records stay. TensorBoard hides its events after ``step`` (a writer opened with
        ``purge_step``), so it too shows the replayed values. The trackers' logging step goes on past the highest
        they were given."""
        self.jsonl.close()
        path = self.log_dir / METRICS_FILE
        kept = [line for line in path.read_text().splitlines(keepends=True) if not _replayed(json.loads(line), step)]
        partial = path.with_name(f"{METRICS_FILE}.tmp")
        partial.write_text("".join(kept))
        os.replace(partial, path)  # a crash here leaves the old file or the new one, never half of one
        self.jsonl = self._open_jsonl()
        if self.writer is not None:
            self.writer.close()
            self.writer = self._open_tensorboard(purge_step=step + 1)
        self.tracker_offset = self.tracker_step + 1 - step

    def scalars(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items()}
        # strict JSON (jq, JSON.parse): a NaN or infinite value is written as null; TensorBoard keeps the number
        finite = {k: v if math.isfinite(v) else None for k, v in clean.items()}
        self.jsonl.write(json.dumps({"step": step, **finite}, allow_nan=False) + "\n")
        if self.writer is not None:
            for name, value in clean.items():
                self.writer.add_scalar(name, value, step)
        tracker_step = self._to_tracker_step(step)
        for tracker in self.trackers:
            tracker.scalars({**clean, GLOBAL_STEP: float(step)}, tracker_step)

    def samples(self, tag: str, images: np.ndarray, prompts: list[str], rewards: np.ndarray, step: int,
                texts: list[str] | None = None) -> Path:
        """A captioned grid of ``images`` (``[N, H, W, 3]``; video frames ``[N, F, H, W, 3]`` use frame 0), titled
        with ``tag``'s split and ``step``; ``texts``: what the OCR read in each image (frame 0), if known."""
        frames = images[:, 0] if images.ndim == 5 else images
        grid = sample_grid(frames, prompts, rewards, title=f"{tag.split('/')[0]} samples, step {step}", texts=texts)
        path = self.log_dir / "samples" / f"{tag.replace('/', '_')}_step{step:06d}.png"
        Image.fromarray(grid).save(path)
        if self.writer is not None:
            self.writer.add_image(tag, grid, step, dataformats="HWC")
            self.writer.add_text(f"{tag}/prompts", "\n\n".join(prompts), step)
        tracker_step = self._to_tracker_step(step)
        for tracker in self.trackers:
            tracker.image(tag, grid, " | ".join(prompts), tracker_step)
        return path

    def videos(self, tag: str, videos: np.ndarray, step: int, fps: int, out_dir: Path | None = None) -> None:
        """uint8 ``[N, F, H, W, 3]`` clips: TensorBoard (needs moviepy) when possible, mp4 files when asked."""
        if self.writer is not None:
            try:
                self.writer.add_video(tag, np.transpose(videos, (0, 1, 4, 2, 3)), step, fps=fps)
            except ImportError:  # TensorBoard's video summary needs moviepy; files below are the fallback
                out_dir = out_dir or self.log_dir / "videos"
        if out_dir is not None:
            import imageio.v3 as iio

            out_dir.mkdir(parents=True, exist_ok=True)
            for i, clip in enumerate(videos):
                iio.imwrite(out_dir / f"{tag.replace('/', '_')}_step{step:06d}_{i}.mp4", clip, fps=fps)

    def close(self, status: str = "finished") -> None:
        """Flush and close every backend; the trackers record how the run ended: ``status`` is ``finished``,
        ``failed`` or ``preempted`` (:mod:`rlrunner.run.preemption`). Idempotent."""
        if self.jsonl.closed:
            return
        self.jsonl.close()
        if self.writer is not None:
            self.writer.close()
        for tracker in self.trackers:
            tracker.close(status)


"""One logger interface for the run: TensorBoard, ``metrics.jsonl``, sample grids and videos on disk."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from rlrunner.logger_backends import TRACKERS, open_trackers


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


def _caption(prompt: str) -> str:
    """The quoted target of a prompt (what the OCR reward looks for), else the prompt's start."""
    parts = prompt.split('"')
    return parts[1] if len(parts) >= 3 else prompt[:24]


def sample_grid(images: np.ndarray, prompts: list[str], rewards: np.ndarray, columns: int = 4) -> np.ndarray:
    """Tile uint8 ``[N, H, W, 3]`` images with a caption (target text and reward) under each; ``[H', W', 3]``."""
    n, height, width = images.shape[:3]
    scale = max(1, 128 // max(height, 1))  # tiny images are enlarged so their captions stay readable
    tile_w, tile_h, caption_h = width * scale, height * scale, 14
    rows = math.ceil(n / columns)
    grid = Image.new("RGB", (columns * tile_w, rows * (tile_h + caption_h)), "white")
    draw, font = ImageDraw.Draw(grid), ImageFont.load_default()
    for i in range(n):
        x, y = (i % columns) * tile_w, (i // columns) * (tile_h + caption_h)
        tile = Image.fromarray(images[i]).resize((tile_w, tile_h), Image.NEAREST)
        grid.paste(tile, (x, y))
        draw.text((x + 2, y + tile_h + 1), f"{_caption(prompts[i])[:20]} r={float(rewards[i]):.2f}", fill="black",
                  font=font)
    return np.asarray(grid)


# runner.logger.logger_backends: metrics.jsonl and samples/ are always written; these are the optional ones
LOGGER_BACKENDS = ("tensorboard", *TRACKERS)


class RunLogger:
    """Writes scalars to TensorBoard, the trackers and ``metrics.jsonl``; images to them and ``samples/``; videos
    to TensorBoard.

    ``project``/``name`` name the run in the trackers (wandb, swanlab, mlflow); ``config`` is the resolved recipe
    they record with it.
    """

    def __init__(self, log_dir: Path, backends: list[str], project: str = "rlrunner", name: str = "",
                 config: dict | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.writer = None
        if "tensorboard" in backends:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.log_dir / "tensorboard"))
        self.trackers = open_trackers(backends, self.log_dir, project, name or self.log_dir.name, config or {})
        self.jsonl = open(self.log_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 (closed in close())
        (self.log_dir / "samples").mkdir(exist_ok=True)

    def scalars(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items()}
        self.jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        if self.writer is not None:
            for name, value in clean.items():
                self.writer.add_scalar(name, value, step)
        for tracker in self.trackers:
            tracker.scalars(clean, step)

    def samples(self, tag: str, images: np.ndarray, prompts: list[str], rewards: np.ndarray, step: int) -> Path:
        """A captioned grid of ``images`` (``[N, H, W, 3]``; video frames ``[N, F, H, W, 3]`` use frame 0)."""
        frames = images[:, 0] if images.ndim == 5 else images
        grid = sample_grid(frames, prompts, rewards)
        path = self.log_dir / "samples" / f"{tag.replace('/', '_')}_step{step:06d}.png"
        Image.fromarray(grid).save(path)
        if self.writer is not None:
            self.writer.add_image(tag, grid, step, dataformats="HWC")
            self.writer.add_text(f"{tag}/prompts", "\n\n".join(prompts), step)
        for tracker in self.trackers:
            tracker.image(tag, grid, " | ".join(prompts), step)
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

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        for tracker in self.trackers:
            tracker.close()
        self.jsonl.close()


"""OCR reward throughput (images/s) on rendered text images, through the real engine.

    .venv/bin/python bench/ocr_throughput.py                       # 64 images of 512 px and of 32x128 px
    .venv/bin/python bench/ocr_throughput.py --num-images 16 --engine rapidocr --modes per_image batched
    .venv/bin/python bench/ocr_throughput.py --quick  # tiny sizes, seconds: tests/project/test_bench_scripts.py

Modes (each on the same images; ``reward`` = mean OCR reward, a sanity check that speed did not cost accuracy):
  per_image   one engine call per image (full detection + recognition)
  batched     ``batch_size`` images per call: detection per image, one recognition over all their text boxes
  rec_only    recognition only (``reward.rec_only``): each image taken as one text line, no detector
  threads     AsyncRewardScorer(num_workers=N) over the batched reward, N slices on N engines with cores/N threads each
  processes   the same split over N worker processes (spawned; images pickled to them) for comparison

Figures (images/s, 64 images, batch_size 16, 2 workers) on the development machine: 2 CPU cores shared with other
jobs (load average 6-7 during the run, so absolute rates are low and noisy; on an idle core a 512 px image took
~0.26 s), rapidocr 3.10 / onnxruntime 1.31 CPU, PP-OCRv6 small models, one line of text per image:

  images      per_image   batched      rec_only       threads x2    processes x2
  512x512     0.8         1.4 (1.8x)   25.2 (32x)*    2.0 (2.5x)    1.6 (2.0x)
  128x32      6.8         7.0 (1.0x)   12.7 (1.9x)    18.4 (2.7x)   14.9 (2.2x)

  * rec_only on 512 px scenes is fast but wrong (mean reward 0.41 instead of 1.00): only for one-line images.
  The load drifted during that run; interleaved A/B runs (8 images of 512 px, 4 rounds) are more reliable:
  per_image 0.50 s/img vs batched 0.49 s/img (detection dominates and runs per image; cross-image batching only
  helps recognition, little on CPU); 1 engine x 2 threads 0.50 s/img vs 2 thread workers x 1 thread 0.40 s/img.
  The detector limit (longest side 960, PaddleOCR 2.x's default) alone makes a 512 px image ~1.7x faster than
  RapidOCR's own default (shorter side upscaled to 736: 0.45 s vs 0.26 s on a quiet core). Thread workers beat
  processes (no pickling, no second copy of the models), hence the thread pool in ``AsyncRewardScorer``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlrunner.rewards import AsyncRewardScorer, build_reward

WORDS = ["Hello World", "Open Late", "Fresh Bread", "RL 2025", "Neon Cafe", "Exit Only", "Sale 50%", "Night Owl"]
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"
#: ``--quick``'s defaults: every mode on two one-line images with one worker (one spawned process)
QUICK = {"num_images": 2, "sizes": ["128x32"], "batch_size": 2, "workers": 1}


def render(text: str, width: int, height: int, seed: int) -> np.ndarray:
    """uint8 [H, W, 3]: ``text`` centred on a noisy background, font sized to fill ~80 % of the width."""
    rng = np.random.default_rng(seed)
    base = np.clip(rng.normal(200, 20, (height, width, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(base)
    draw = ImageDraw.Draw(image)
    size = height
    while size > 6:
        font = ImageFont.truetype(FONT, size) if os.path.exists(FONT) else ImageFont.load_default(size=size)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        if right - left <= 0.8 * width and bottom - top <= 0.8 * height:
            break
        size -= 2
    draw.text(
        ((width - right + left) / 2 - left, (height - bottom + top) / 2 - top), text, font=font, fill=(20, 20, 40)
    )
    return np.array(image)


def dataset(num: int, width: int, height: int) -> tuple[np.ndarray, list[str]]:
    words = [WORDS[i % len(WORDS)] for i in range(num)]
    images = np.stack([render(w, width, height, seed=i) for i, w in enumerate(words)])
    return images, [f'a sign that says "{w}"' for w in words]


def timed(fn: Callable[[], np.ndarray], repeats: int = 1) -> tuple[float, float]:
    """(best seconds over ``repeats``, mean reward of the last run)."""
    best, scores = float("inf"), np.zeros(1)
    for _ in range(repeats):
        start = time.perf_counter()
        scores = fn()
        best = min(best, time.perf_counter() - start)
    return best, float(np.mean(scores))


_WORKER_REWARD = None


def _init_worker(cfg: dict) -> None:
    global _WORKER_REWARD
    _WORKER_REWARD = build_reward(cfg)


def _score_in_worker(images: np.ndarray, prompts: list[str]) -> np.ndarray:
    return _WORKER_REWARD(images, prompts).avg


Scorer = Callable[[np.ndarray, list[str]], np.ndarray]


def build_modes(args: argparse.Namespace) -> tuple[dict[str, Scorer], list[Callable[[], None]]]:
    """The scorers to time (images, prompts -> rewards [N]) and the functions that release them."""
    base = {"model": "ocr", "engine": args.engine, "batch_size": args.batch_size}
    per_image, batched = build_reward({**base, "batch_size": 1}), build_reward(base)
    modes: dict[str, Scorer] = {
        "per_image": lambda x, p: per_image(x, p).avg,
        "batched": lambda x, p: batched(x, p).avg,
    }
    closers: list[Callable[[], None]] = []
    if "rec_only" in args.modes:
        rec_only = build_reward({**base, "rec_only": True})
        modes["rec_only"] = lambda x, p: rec_only(x, p).avg
    if "threads" in args.modes:
        scorer = AsyncRewardScorer(build_reward({**base, "num_workers": args.workers}), num_workers=args.workers)

        def in_threads(images: np.ndarray, prompts: list[str]) -> np.ndarray:
            splits = np.array_split(np.arange(len(images)), args.workers)  # as the driver cuts (shares.reward_slices)
            return scorer.submit_all([(images[s], [prompts[i] for i in s]) for s in splits]).result().avg

        modes["threads"] = in_threads
        closers.append(scorer.close)
    if "processes" in args.modes:
        import multiprocessing as mp

        cfg = {**base, "num_workers": args.workers}
        pool = ProcessPoolExecutor(args.workers, mp.get_context("spawn"), initializer=_init_worker, initargs=(cfg,))

        def in_processes(images: np.ndarray, prompts: list[str]) -> np.ndarray:
            splits = np.array_split(np.arange(len(images)), args.workers)
            futures = [pool.submit(_score_in_worker, images[s], [prompts[i] for i in s]) for s in splits]
            return np.concatenate([f.result() for f in futures])

        modes["processes"] = in_processes
        closers.append(pool.shutdown)
    return {name: fn for name, fn in modes.items() if name in args.modes}, closers


def run_modes(
    modes: dict[str, Scorer], images: np.ndarray, prompts: list[str], args: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """(seconds, mean reward) per mode; each mode is first warmed up on a few images (engines built, models loaded)."""
    results = {}
    for name, fn in modes.items():
        fn(images[: 2 * args.workers], prompts[: 2 * args.workers])
        results[name] = timed(lambda fn=fn: fn(images, prompts), args.repeats)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-images", type=int, default=64)
    parser.add_argument("--sizes", nargs="+", default=["512x512", "128x32"], help="WxH of each image set")
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--modes", nargs="+", default=["per_image", "batched", "rec_only", "threads", "processes"])
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny sizes ({QUICK}; options given still apply): checks the script runs in seconds")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{args.num_images} images per set, batch_size {args.batch_size}, {args.workers} workers, {cores} cores")
    print(f"{'images':<12}{'mode':<12}{'img/s':>8}{'vs per_image':>14}{'reward':>8}")
    modes, closers = build_modes(args)
    try:
        for size in args.sizes:
            width, height = (int(v) for v in size.split("x"))
            images, prompts = dataset(args.num_images, width, height)
            results = run_modes(modes, images, prompts, args)
            reference = results.get("per_image", next(iter(results.values())))[0]
            for mode, (seconds, reward) in results.items():
                rate = len(images) / seconds
                print(f"{size:<12}{mode:<12}{rate:>8.1f}{reference / seconds:>13.2f}x{reward:>8.3f}", flush=True)
    finally:
        for close in closers:
            close()


if __name__ == "__main__":
    main()

"""Reward throughput through the reward server (HTTP, ``reward.model: remote``) vs the same reward in-process.

    .venv/bin/python bench/reward_service.py                              # 64 digit images 32x96, rec_only OCR
    .venv/bin/python bench/reward_service.py --size 256 --no-rec-only --num-images 32 --batch-sizes 1 16
    .venv/bin/python bench/reward_service.py --quick  # tiny sizes, seconds: tests/project/test_bench_scripts.py

Starts ``python -m rlrunner.commands.serve_reward`` on a free 127.0.0.1 port with the same engine and settings as the
local reward, scores the same images in batches of each size (one request in flight, as the local reward runs one
batch at a time), alternating local and remote rounds so that both see the same machine load, and prints
images/s of both and the ratio of their times (the HTTP path's overhead; target <= 1.2 at batch 16). It also
checks that both give the same rewards. Only loopback traffic.

Figures on the development machine (2 CPU cores shared with other jobs, load average 5-11: absolute rates and
ratios are noisy to about +-30 %), rapidocr 3.10 CPU, one scoring thread on each side, same rewards in every run:

  images                            batch 1: local  server  ratio     batch 16: local  server  ratio
  32x96 digits, rec_only, 4 rounds           24.2    21.5   1.12                15.6    16.8   0.93
  32x96 digits, rec_only, 3 rounds            4.0     3.3   1.22                 3.8     4.0   0.93
  256x256, detection, 2 rounds                1.5     2.0   0.72                 3.9     3.0   1.32

  The HTTP path adds PNG encoding/decoding (level 1) and JSON; against OCR's milliseconds per image it is lost in
  the machine's noise. Batch 16 amortises the per-request cost; batch 1 pays one round trip per image.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlrunner.rewards import build_reward

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"
STARTUP_S = 120.0
#: ``--quick``'s defaults: two digit strips in one batch of 2, one round (the server still starts)
QUICK = {"num_images": 2, "batch_sizes": [2], "rounds": 1}


def render_digits(text: str, height: int, width: int, seed: int) -> np.ndarray:
    """uint8 [H, W, 3]: dark ``text`` on a noisy light background."""
    rng = np.random.default_rng(seed)
    image = Image.fromarray(np.clip(rng.normal(210, 15, (height, width, 3)), 0, 255).astype(np.uint8))
    size = int(height * 0.7) if width > 2 * height else height // 4
    font = ImageFont.truetype(FONT, size) if os.path.exists(FONT) else ImageFont.load_default(size=size)
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    draw.text(((width - right + left) / 2 - left, (height - bottom + top) / 2 - top), text, font=font, fill=(20,) * 3)
    return np.array(image)


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "rlrunner.commands.serve_reward", "--engine", args.engine, "--port", str(port),
               "--set", f"rec_only={str(args.rec_only).lower()}", "--set", f"batch_size={max(args.batch_sizes)}"]
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import requests

    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline and process.poll() is None:  # bounded wait for /health
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except requests.ConnectionError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the reward server did not start within {STARTUP_S} s")


def timed(reward, images: np.ndarray, prompts: list[str], batch: int) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    scores = [reward(images[i:i + batch], prompts[i:i + batch]).avg for i in range(0, len(images), batch)]
    return time.perf_counter() - start, np.concatenate(scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-images", type=int, default=64)
    parser.add_argument("--size", type=int, default=0, help="square images of this size (0: 32x96 digit strips)")
    parser.add_argument("--engine", default="rapidocr")
    parser.add_argument("--no-rec-only", dest="rec_only", action="store_false", help="full detection + recognition")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3, help="alternating local/remote rounds per batch size")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny sizes ({QUICK}; options given still apply): checks the script runs in seconds")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args()

    height, width = (args.size, args.size) if args.size else (32, 96)
    texts = [str(2345 + 37 * i) for i in range(args.num_images)]
    images = np.stack([render_digits(t, height, width, i) for i, t in enumerate(texts)])
    prompts = [f'a sign that says "{t}"' for t in texts]
    process, url = start_server(args)
    try:
        keys = {"engine": args.engine, "rec_only": args.rec_only}
        local = build_reward({"model": "ocr", **keys, "batch_size": max(args.batch_sizes)})
        print(f"{args.num_images} images {height}x{width}, engine {args.engine}, rec_only={args.rec_only}, "
              f"{args.rounds} alternating rounds, {os.cpu_count()} CPUs (shared: absolute rates are noisy)")
        print(f"{'batch':>5}  {'local img/s':>11}  {'server img/s':>12}  {'time ratio server/local':>23}  same rewards")
        for batch in args.batch_sizes:
            remote = build_reward({"model": "remote", "url": url, "batch_size": batch, "max_concurrency": 1})
            timed(local, images[:batch], prompts[:batch], batch)  # warm-up: engine sessions, connections
            timed(remote, images[:batch], prompts[:batch], batch)
            local_s = remote_s = 0.0
            same = True
            for _ in range(args.rounds):
                seconds, local_scores = timed(local, images, prompts, batch)
                local_s += seconds
                seconds, remote_scores = timed(remote, images, prompts, batch)
                remote_s += seconds
                same &= bool(np.array_equal(local_scores, remote_scores))
            total = args.rounds * args.num_images
            print(f"{batch:>5}  {total / local_s:>11.1f}  {total / remote_s:>12.1f}  {remote_s / local_s:>23.2f}  "
                  f"{same}")
    finally:
        process.kill()
        process.wait(timeout=30)


if __name__ == "__main__":
    main()

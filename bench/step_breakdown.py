"""Where a training step's time goes, with reward scoring overlapped with the rollout and without.

    .venv/bin/python bench/step_breakdown.py [--steps 4] [key=value ...]
    .venv/bin/python bench/step_breakdown.py --quick    # seconds, tiny sizes: checks that it runs (a test does)

Runs the default recipe (tiny model, real OCR reward, in-process workers) for a few steps twice —
``runner.async_reward=true`` then ``false`` — and prints the median seconds per phase and:

* ``step / (rollout + train)``: 1.0 means reward scoring, advantages, EMA and sync cost nothing beyond the two
  phases that must run; target ≤ 1.15 with async reward on.
* ``(ema + sync) / step``: the share of the EMA update and the LoRA weight sync; target ≤ 2 %.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing rlrunner
from rlrunner.cluster import create_cluster
from rlrunner.recipe import load_recipe
from rlrunner.run.runner import Runner

PHASES = ("rollout", "reward", "advantages", "train", "ema", "sync", "step")
#: ``--quick``: steps of one prompt's two samples, each sampled in two denoising steps
QUICK_OVERRIDES = ["algorithm.group_size=2", "env.train.total_num_envs=2", "actor.micro_batch_size=2",
                   "actor.global_batch_size=2", "actor.model.tiny.num_steps=2"]


def measure(overrides: list[str], steps: int) -> dict[str, float]:
    cfg = load_recipe("tiny_nft_ocr", [*overrides, "runner.val_before_train=false", "cluster.backend=local"])
    torch.set_num_threads(max(1, int(cfg.cluster.cpus_per_worker)))  # as run() has in-process workers compute
    with tempfile.TemporaryDirectory() as log_dir, create_cluster(cfg.cluster) as cluster:
        runner = Runner(cfg, Path(log_dir), cluster)
        try:
            runner.train_step()  # warm-up: first calls build caches and OCR sessions
            samples = [runner.train_step() for _ in range(steps)]
        finally:
            runner.close()
    return {phase: statistics.median(s.get(f"time/{phase}", 0.0) for s in samples) for phase in PHASES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true",
                        help="seconds, tiny sizes (1 prompt x 2 samples, 2 denoising steps, 1 timed step unless "
                             "--steps says): checks that the script runs (tests/project/test_bench_scripts.py)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(steps=1)
        args = parser.parse_args()
    overrides = [*QUICK_OVERRIDES, *args.overrides] if args.quick else args.overrides
    results = {mode: measure([*overrides, f"runner.async_reward={mode}"], args.steps) for mode in ("true", "false")}
    print(f"median seconds per step over {args.steps} steps (after one warm-up step)")
    print(f"{'phase':<12}" + "".join(f"{'async=' + m:>14}" for m in results))
    for phase in PHASES:
        print(f"{phase:<12}" + "".join(f"{r[phase]:>14.3f}" for r in results.values()))
    for mode, r in results.items():
        overhead = r["step"] / (r["rollout"] + r["train"])
        share = (r["ema"] + r["sync"]) / r["step"]
        print(f"async_reward={mode}: step/(rollout+train) = {overhead:.3f} (target <= 1.15 with async on); "
              f"(ema+sync)/step = {100 * share:.2f} % (target <= 2 %)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

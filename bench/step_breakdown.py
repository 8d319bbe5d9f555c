"""Where a training step's time goes, with reward scoring overlapped with the rollout and without.

    .venv/bin/python bench/step_breakdown.py [--steps 4] [key=value ...]

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing rlrunner
from rlrunner.cluster import create_cluster
from rlrunner.recipe import load_recipe
from rlrunner.run.runner import Runner

PHASES = ("rollout", "reward", "advantages", "train", "ema", "sync", "step")


def measure(overrides: list[str], steps: int) -> dict[str, float]:
    cfg = load_recipe("tiny_nft_ocr", [*overrides, "runner.val_before_train=false", "cluster.backend=local"])
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
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    results = {mode: measure([*args.overrides, f"runner.async_reward={mode}"], args.steps) for mode in ("true", "false")}
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

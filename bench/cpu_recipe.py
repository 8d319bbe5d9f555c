"""Time per phase and reward gained per minute of the CPU recipe (tiny model, OCR reward).

    .venv/bin/python bench/cpu_recipe.py                      # runs the NFT CPU recipe tiny_nft_ocr (~11 min), then reports
    .venv/bin/python bench/cpu_recipe.py --run-dir logs/<run> # reports on a finished run of run_diffusion.sh
    .venv/bin/python bench/cpu_recipe.py runner.max_steps=10  # a shorter run (dotted overrides as for the launcher)
    .venv/bin/python bench/cpu_recipe.py --quick              # seconds, tiny sizes: checks that it runs (a test does)

Prints the median seconds per step of rollout / OCR (waiting for rewards) / train / EMA / sync, the held-out OCR
reward before and after training with the chance level beside it, and held-out reward gained per minute of
wall-clock training.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = {"rollout": "time/rollout", "OCR": "time/reward", "train": "time/train", "ema": "time/ema",
          "sync": "time/sync", "step": "time/step"}
#: ``--quick``: one training step of one prompt's two samples between the two evals, two denoising steps, no
#: checkpoint nor sample grids
QUICK_OVERRIDES = ["runner.max_steps=1", "runner.save_interval=-1", "runner.sample_log_interval=0",
                   "algorithm.group_size=2", "env.train.total_num_envs=2", "env.eval.total_num_envs=2",
                   "actor.micro_batch_size=2", "actor.global_batch_size=2", "actor.model.tiny.num_steps=2",
                   "actor.model.tiny.eval_num_steps=2"]


def chance_level(run_dir: Path) -> float | None:
    """The tiny model card's chance level, if the run used the shipped tiny model."""
    config = (run_dir / "config.yaml").read_text()
    for line in config.splitlines():
        if line.strip().startswith("model_path:"):
            card = ROOT / line.split(":", 1)[1].strip() / "model_index.json"
            if card.is_file():
                return json.loads(card.read_text()).get("evaluation", {}).get("chance_level")
    return None


def report(run_dir: Path) -> None:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "env/avg" in r]
    evals = [r for r in records if "eval/avg" in r]
    if not train or len(evals) < 2:
        sys.exit(f"{run_dir} has {len(train)} training steps and {len(evals)} evals; need ≥ 1 and ≥ 2")
    print(f"run: {run_dir} ({len(train)} steps)")
    for name, key in PHASES.items():
        print(f"  {name:<8} {statistics.median(r[key] for r in train):8.3f} s/step (median)")
    minutes = sum(r["time/step"] for r in train) / 60 + sum(r.get("time/eval", 0.0) for r in evals) / 60
    first, last = evals[0], evals[-1]
    chance = chance_level(run_dir)
    chance_text = f" (chance level {chance:.3f})" if chance is not None else ""
    print(f"  held-out reward: step {first['step']} {first['eval/avg']:.4f} -> step {last['step']} "
          f"{last['eval/avg']:.4f}{chance_text}")
    print(f"  training reward (env/avg): first step {train[0]['env/avg']:.4f}, mean of last 5 steps "
          f"{statistics.mean(r['env/avg'] for r in train[-5:]):.4f}")
    print(f"  wall clock {minutes:.1f} min (steps + evals); held-out reward gained per minute "
          f"{(last['eval/avg'] - first['eval/avg']) / minutes:+.4f}")


def run_recipe(overrides: list[str], log_root: Path) -> Path:
    """Run tiny_nft_ocr with ``overrides`` through the launcher, logging under ``log_root``; its run folder."""
    before = set(log_root.glob("*-tiny_nft_ocr"))
    subprocess.run(["bash", str(ROOT / "examples/diffusion/run_diffusion.sh"), "tiny_nft_ocr", *overrides],
                   check=True, cwd=ROOT, env={**os.environ, "RLRUNNER_LOG_ROOT": str(log_root)})
    (run_dir,) = set(log_root.glob("*-tiny_nft_ocr")) - before
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, help="a finished run's log directory")
    parser.add_argument("--quick", action="store_true",
                        help="seconds: a new run of 1 step of 2 samples, 2 denoising steps, logged to a temporary "
                             "folder: checks that the script runs (tests/project/test_bench_scripts.py)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for a new run of tiny_nft_ocr")
    args = parser.parse_args()
    if args.run_dir is not None:
        report(args.run_dir)
    elif args.quick:
        with tempfile.TemporaryDirectory() as log_root:
            report(run_recipe([*QUICK_OVERRIDES, *args.overrides], Path(log_root)))
    else:
        report(run_recipe(args.overrides, Path(os.environ.get("RLRUNNER_LOG_ROOT", ROOT / "logs"))))


if __name__ == "__main__":
    main()

"""Time per phase and reward gained per minute of the CPU recipe (tiny model, OCR reward).

    .venv/bin/python bench/cpu_recipe.py                      # runs the NFT CPU recipe tiny_nft_ocr (~11 min), then reports
    .venv/bin/python bench/cpu_recipe.py --run-dir logs/<run> # reports on a finished run of run_diffusion.sh
    .venv/bin/python bench/cpu_recipe.py runner.max_steps=10  # a shorter run (dotted overrides as for the launcher)

Prints the median seconds per step of rollout / OCR (waiting for rewards) / train / EMA / sync, the held-out OCR
reward before and after training with the chance level beside it, and held-out reward gained per minute of
wall-clock training.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = {"rollout": "time/rollout", "OCR": "time/reward", "train": "time/train", "ema": "time/ema",
          "sync": "time/sync", "step": "time/step"}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, help="a finished run's log directory")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for a new run of tiny_nft_ocr")
    args = parser.parse_args()
    run_dir = args.run_dir
    if run_dir is None:
        logs = ROOT / "logs"
        before = set(logs.glob("*-tiny_nft_ocr"))
        subprocess.run(["bash", str(ROOT / "examples/diffusion/run_diffusion.sh"), "tiny_nft_ocr", *args.overrides],
                       check=True, cwd=ROOT)
        (run_dir,) = set(logs.glob("*-tiny_nft_ocr")) - before
    report(run_dir)


if __name__ == "__main__":
    main()

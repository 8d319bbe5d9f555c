"""Held-out OCR reward gained by each algorithm on the CPU recipe, at the same wall-clock budget.

    .venv/bin/python bench/algorithms.py                              # every variant, seed 42 (about 45 minutes)
    .venv/bin/python bench/algorithms.py --variants nft flow_grpo --seeds 1 2
    .venv/bin/python bench/algorithms.py --calibrate-only             # seconds per step of each variant
    .venv/bin/python bench/algorithms.py --report-only --out bench_runs/algorithms   # the table of finished runs

Everything but the algorithm is the shipped ``tiny_nft_ocr`` recipe (model, prompts, OCR reward, group size,
batch, learning rate, EMA schedule, evals every 20 steps on 128 held-out prompts with fixed noise).

1. **Calibrate.** Each variant trains ``--calibration-steps`` steps (no eval) in turn, on a quiet machine; the median
   seconds per step after the first give its step budget: ``steps = budget / (s/step)``, where the budget is the
   shipped recipe's ``runner.max_steps`` (100) at the shipped variant's seconds per step. A variant that spends
   twice as long per step gets half the steps.
2. **Run** each variant and seed with its steps (``--parallel 2`` runs two at a time: each run's phases are
   sequential on one torch thread, so two share the 2 cores; their wall clock is then longer than calibrated,
   which does not change their steps).
3. **Report** a markdown table: steps, minutes (steps × calibrated s/step, evals excluded), held-out reward at
   step 0, 20 and the end, the gain, and its mean over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "tiny_nft_ocr"
SHIPPED_STEPS = 100  # the recipe's runner.max_steps: the budget is these steps at the shipped variant's speed
# variant -> (description, overrides of the shipped recipe)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "nft": ("NFT, as shipped", []),
    "nft_sampler_t": ("NFT, training t on the sampler's sigmas (`nft_train_timesteps: sampler`)",
                      ["algorithm.nft_train_timesteps=sampler"]),
    "nft_cached": ("NFT on the rollout's states with cached v_old (`nft_xcur_source: rollout`)",
                   ["algorithm.nft_xcur_source=rollout"]),
    # the anchor to the base model (official OCR value 0.003) keeps AWM from drifting at the recipe's lr 1e-3; 2 noise
    # levels per sample instead of the official 6 cost 3 s of update per step instead of 8 on 2 cores
    "awm": ("AWM (`ref_kl_coef: 0.003`, 2 noise levels per sample)",
            ["algorithm.name=awm", "algorithm.ref_kl_coef=0.003", "algorithm.awm_timesteps_per_sample=2"]),
    # 4 optimizer steps per rollout (the official trainer takes several), so that the ratio clip acts
    "flow_grpo": ("FlowGRPO", ["algorithm.name=flow_grpo", "actor.global_batch_size=16"]),
    "flow_grpo_fast": ("FlowGRPO-Fast (SDE window of 2 steps in the first half)",
                       ["algorithm.name=flow_grpo", "actor.global_batch_size=16", "algorithm.flow_grpo_sde_window_size=2"]),
    "shuffle": ("control: NFT with shuffled rewards", ["algorithm.reward_signal=shuffle"]),
}


def train(overrides: list[str], log_path: Path) -> Path:
    """One run of the recipe with ``overrides``; returns its log directory."""
    log_path.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "rlrunner.train", "--config-name", RECIPE, *overrides,
               f"runner.logger.log_path={log_path}"]
    with open(log_path / "stdout.log", "w") as out:
        result = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        sys.exit(f"run failed ({result.returncode}): {' '.join(command)}; see {log_path / 'stdout.log'}")
    (run_dir,) = [p for p in log_path.iterdir() if p.is_dir()]
    return run_dir


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def calibrate(names: list[str], steps: int, out: Path) -> dict[str, float]:
    """Median seconds per training step of each variant (the first step excluded: caches, OCR sessions)."""
    seconds = {}
    for name in names:
        run_dir = train([*VARIANTS[name][1], f"runner.max_steps={steps}", "runner.val_before_train=false",
                         "runner.val_check_interval=0", "runner.save_interval=0", "runner.sample_log_interval=0"],
                        out / "calibration" / name)
        seconds[name] = statistics.median([r["time/step"] for r in records(run_dir) if "time/step" in r][1:])
        print(f"  {name:<16} {seconds[name]:6.2f} s/step", flush=True)
    (out / "calibration.json").write_text(json.dumps(seconds, indent=1))
    return seconds


def run_dir_of(out: Path, name: str, seed: int) -> Path:
    return out / "runs" / f"{name}-seed{seed}"


def report(names: list[str], seeds: list[int], out: Path, seconds: dict[str, float]) -> None:
    print("\n| variant | seed | steps | min (steps × s/step) | held-out step 0 | step 20 | end | gain |\n"
          "|---|---|---|---|---|---|---|---|")
    for name in names:
        gains = []
        for seed in seeds:
            logs = run_dir_of(out, name, seed)
            found = [p for p in logs.iterdir() if p.is_dir()] if logs.is_dir() else []
            if not found:
                continue
            evals = {r["step"]: r["eval/avg"] for r in records(found[0]) if "eval/avg" in r}
            first, last = evals[0], evals[max(evals)]
            gains.append(last - first)
            print(f"| {VARIANTS[name][0]} | {seed} | {max(evals)} | {max(evals) * seconds[name] / 60:.1f} | "
                  f"{first:.3f} | {evals.get(20, float('nan')):.3f} | {last:.3f} | {last - first:+.3f} |")
        if len(gains) > 1:
            print(f"| {VARIANTS[name][0]}: mean of {len(gains)} seeds | | | | | | | {statistics.mean(gains):+.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[42])
    parser.add_argument("--calibration-steps", type=int, default=4)
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
    parser.add_argument("--out", type=Path, default=ROOT / "bench_runs" / "algorithms")
    parser.add_argument("--calibrate-only", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="reuse the calibration and runs under --out")
    args = parser.parse_args()
    names = list(dict.fromkeys(["nft", *args.variants]))  # the shipped variant sets the budget
    calibration = args.out / "calibration.json"
    if args.report_only or (calibration.is_file() and set(names) <= set(json.loads(calibration.read_text()))):
        seconds = json.loads(calibration.read_text())
        names = [name for name in names if name in seconds]  # --report-only: the calibrated variants
    else:
        print(f"calibrating ({args.calibration_steps} steps each):", flush=True)
        seconds = calibrate(names, args.calibration_steps, args.out)
    budget = {name: max(1, round(SHIPPED_STEPS * seconds["nft"] / seconds[name])) for name in names}
    print("steps within the budget of " + f"{SHIPPED_STEPS} shipped steps ({SHIPPED_STEPS * seconds['nft'] / 60:.1f} "
          "min): " + ", ".join(f"{name} {budget[name]}" for name in names), flush=True)
    if args.calibrate_only:
        return
    names = [n for n in names if n in args.variants]
    if not args.report_only:
        jobs = [(name, seed) for name in names for seed in args.seeds if not run_dir_of(args.out, name, seed).exists()]

        def run(job: tuple[str, int]) -> None:
            name, seed = job
            train([*VARIANTS[name][1], f"runner.max_steps={budget[name]}", f"runner.seed={seed}", f"actor.seed={seed}",
                   "runner.save_interval=0"], run_dir_of(args.out, name, seed))
            print(f"  done: {name} seed {seed}", flush=True)

        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            list(pool.map(run, jobs))
    report(names, args.seeds, args.out, seconds)


if __name__ == "__main__":
    main()

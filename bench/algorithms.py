"""Held-out OCR reward gained by each algorithm and setting on the CPU recipe, at the same wall-clock budget.

    bin/rlrunner python bench/algorithms.py --variants nft awm --parallel 2          # two runs at a time
    bin/rlrunner python bench/algorithms.py --variants nft_beta0.1 awm --seeds 1 2 --parallel 2
    bin/rlrunner python bench/algorithms.py --variants awm_shuffle --seeds 42 1 2 --max-steps 40   # CI's control
    bin/rlrunner python bench/algorithms.py --calibrate-only             # seconds per step of each variant
    bin/rlrunner python bench/algorithms.py --report-only --seeds 42 1 2  # the table of finished runs (table.md)
    bin/rlrunner python bench/algorithms.py --variants awm nft_now nft_beta0.03_kl --seeds 42 1 2 --parallel 2 \
        --steps awm=83 nft_now=100 nft_beta0.03_kl=94    # the README's comparison, at the recipes' step budgets

Everything but the variant's overrides is the shipped ``tiny_nft_ocr`` recipe (model, prompts, OCR reward, group
size, batch, learning rate, EMA schedule), with held-out evals every 10 steps on 128 prompts with fixed noise.

1. **Calibrate.** Each variant that computes something different per step trains ``--calibration-steps`` steps
   (no eval) in turn, on a quiet machine; a variant that only changes numbers (β, c, the EMA schedule, lr) shares
   its parent's calibration. The median seconds per step after the first give its step budget:
   ``steps = budget / (s/step)``, where the budget is the NFT recipe's ``runner.max_steps`` (100) at the ``nft``
   variant's seconds per step. A variant that spends twice as long per step gets half the steps.
2. **Run** each variant and seed with its steps (``--parallel 2`` runs two at a time: each run's phases are
   sequential on one torch thread, so two share the 2 cores; their wall clock is then longer than calibrated,
   which does not change their steps or results). Finished runs under ``--out`` are kept and not rerun.
   ``--steps VARIANT=N`` gives a variant its steps instead: the shipped recipes' ``runner.max_steps`` are such a
   budget, calibrated once on a quiet machine (a calibration on a shared one moves with its load).
3. **Report** two markdown tables (printed and written to ``--out``/table.md): each run's steps, minutes (steps ×
   calibrated s/step, evals excluded), held-out reward every 10 steps and at the end, the gain, and means over
   seeds; then a row per variant with its steps, s/step, each seed's gain and their mean; above them, the date, the
   lock's hash, the torch build, the CPU and the commit (bench/provenance.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from provenance import provenance  # bench/ is not a package: imported by path

RECIPE = "tiny_nft_ocr"
SHIPPED_STEPS = 100  # the NFT recipe's runner.max_steps: the budget is these steps at the `nft` variant's speed
EVAL_EVERY = 10


@dataclass(frozen=True)
class Variant:
    description: str
    overrides: list[str]
    speed_of: str = ""  # a variant that computes exactly the same per step shares that variant's calibration


NFT = ["algorithm.name=nft", "algorithm.nft_beta=1.0"]  # the recipe before the sweep; it now ships beta 0.1
NFT_NOW = ["algorithm.name=nft"]  # the recipe as it ships since that sweep (beta 0.1)
AWM = ["algorithm.name=awm", "algorithm.ref_kl_coef=0.003", "algorithm.awm_timesteps_per_sample=2"]
FLOW_GRPO = ["algorithm.name=flow_grpo", "actor.global_batch_size=16"]
FLOW_GRPO_FAST = [*FLOW_GRPO, "algorithm.flow_grpo_sde_window_size=2"]
VARIANTS: dict[str, Variant] = {
    "nft": Variant("NFT, `nft_beta: 1.0` (the recipe before this sweep)", NFT),
    # what sets NFT's step: the pull v_old + (2r - 1)(u - v_old)/β with r = (clip(A, ±c) + c)/2c, i.e. A/(cβ)
    **{f"nft_beta{b}": Variant(f"NFT, `nft_beta: {b}`" + (" (the recipe now)" if b == "0.1" else ""),
                               [*NFT, f"algorithm.nft_beta={b}"], "nft") for b in ("0.5", "0.2", "0.1")},
    **{f"nft_clip{c}": Variant(f"NFT, `adv_clip_max: {c}`", [*NFT, f"algorithm.adv_clip_max={c}"], "nft")
       for c in ("2", "1")},
    "nft_tau_onpolicy": Variant("NFT, `nft_tau: 1.0` (old policy = current: on-policy)",
                                [*NFT, "algorithm.nft_tau=1.0"], "nft"),
    # official delayed_linear_to_0_999 (η = 0 before optimizer step 75, then +0.0075 per step up to 0.999) at 1/4 of
    # its steps: copy to step 19, then tau = 1 - η falls linearly to 0.001 at step 52
    "nft_tau_official": Variant("NFT, official `delayed_linear_to_0_999` at 1/4 of its steps "
                                "(`nft_tau: [1.0, 0.001, 19, 52]`)",
                                [*NFT, "algorithm.nft_tau=[1.0,0.001,19,52]"], "nft"),
    "nft_tau_slow": Variant("NFT, slower ramp (`nft_tau: [1.0, 0.1, 0, 60]`)",
                            [*NFT, "algorithm.nft_tau=[1.0,0.1,0,60]"], "nft"),
    "nft_lr2e-3": Variant("NFT, `lr: 2e-3`", [*NFT, "actor.optim.lr=2.0e-3"], "nft"),
    "nft_kl": Variant("NFT + KL anchor to the base model (`ref_kl_coef: 0.003`)",
                      [*NFT, "algorithm.ref_kl_coef=0.003"]),
    "nft_sampler_t": Variant("NFT, training t on the sampler's sigmas (`nft_train_timesteps: sampler`)",
                             [*NFT, "algorithm.nft_train_timesteps=sampler"], "nft"),
    # issue 44's sweep, on the recipe as it ships (beta 0.1, tau [1.0, 0.1, 0, 20], one level per sample, no anchor)
    "nft_beta0.05_kl": Variant("NFT, `nft_beta: 0.05`, `ref_kl_coef: 0.003`",
                               [*NFT_NOW, "algorithm.nft_beta=0.05", "algorithm.ref_kl_coef=0.003"], "nft_now_kl"),
    "nft_beta0.03_kl": Variant("NFT, `nft_beta: 0.03`, `ref_kl_coef: 0.003`",
                               [*NFT_NOW, "algorithm.nft_beta=0.03", "algorithm.ref_kl_coef=0.003"], "nft_now_kl"),
    "nft_now_kl": Variant("NFT, `nft_beta: 0.1`, `ref_kl_coef: 0.003`", [*NFT_NOW, "algorithm.ref_kl_coef=0.003"]),
    # Flow-Factory caps the official schedule's eta at 0.5: the recipe's ramp (eta 0.9/20 per step), held at 0.5
    "nft_eta0.5": Variant("NFT, eta capped at 0.5 (`nft_tau: [1.0, 0.5, 0, 11]`)",
                          [*NFT_NOW, "algorithm.nft_tau=[1.0,0.5,0,11]"], "nft"),
    **{f"nft_k{k}": Variant(f"NFT, {k} distinct noise levels per sample (`nft_timesteps_per_sample: {k}`)",
                            [*NFT_NOW, f"algorithm.nft_timesteps_per_sample={k}"]) for k in (2, 4)},
    # the official OCR trainer's two optimizer steps per rollout: 64 samples in two steps of 32
    "nft_opt2": Variant("NFT, 2 optimizer steps per rollout (`actor.global_batch_size: 32`)",
                        [*NFT_NOW, "actor.global_batch_size=32"]),
    # the two that gained on seed 42, together; a second optimizer step cost 3 % per step when calibrated alone
    # (5.79 against 5.64 s), within the calibration's noise, so the pair takes the 2-level variant's budget
    "nft_opt2_k2": Variant("NFT, 2 optimizer steps per rollout and 2 distinct levels per sample",
                           [*NFT_NOW, "actor.global_batch_size=32", "algorithm.nft_timesteps_per_sample=2"], "nft_k2"),
    "nft_now": Variant("NFT as shipped (`nft_beta: 0.1`)", NFT_NOW, "nft"),
    "nft_cached": Variant("NFT on the rollout's states with cached v_old (`nft_xcur_source: rollout`)",
                          [*NFT, "algorithm.nft_xcur_source=rollout"]),
    # the anchor to the base model (official OCR value 0.003) keeps AWM from drifting at the recipe's lr 1e-3; 2 noise
    # levels per sample instead of the official 6 cost 3 s of update per step instead of 8 on 2 cores
    "awm": Variant("AWM (`ref_kl_coef: 0.003`, 2 noise levels per sample)", AWM),
    "awm_lr2e-3": Variant("AWM, `lr: 2e-3`", [*AWM, "actor.optim.lr=2.0e-3"], "awm"),
    "awm_kl0.01": Variant("AWM, `ref_kl_coef: 0.01`", [*AWM, "algorithm.ref_kl_coef=0.01"], "awm"),
    # 4 optimizer steps per rollout (the official trainer takes several), so that the ratio clip acts
    "flow_grpo": Variant("FlowGRPO", FLOW_GRPO),
    "flow_grpo_fast": Variant("FlowGRPO-Fast (SDE window of 2 steps in the first half)", FLOW_GRPO_FAST),
    "flow_grpo_fast_lr3e-4": Variant("FlowGRPO-Fast, `lr: 3e-4`", [*FLOW_GRPO_FAST, "actor.optim.lr=3.0e-4"],
                                     "flow_grpo_fast"),
    "flow_grpo_fast_noise1.0": Variant("FlowGRPO-Fast, `flow_grpo_noise_level: 1.0`",
                                       [*FLOW_GRPO_FAST, "algorithm.flow_grpo_noise_level=1.0"], "flow_grpo_fast"),
    "shuffle": Variant("control: NFT with shuffled rewards", [*NFT, "algorithm.reward_signal=shuffle"], "nft"),
    "awm_shuffle": Variant("control: AWM with shuffled rewards", [*AWM, "algorithm.reward_signal=shuffle"], "awm"),
}


def train(overrides: list[str], log_path: Path) -> Path:
    """One run of the recipe with ``overrides``; returns its log directory."""
    log_path.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "rlrunner.commands.train", "--config-name", RECIPE, *overrides,
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
    """Median seconds per training step of each variant (the first step excluded: caches, OCR sessions); a variant
    with ``speed_of`` gets that variant's."""
    seconds: dict[str, float] = {}
    for name in dict.fromkeys(VARIANTS[n].speed_of or n for n in names):
        run_dir = train([*VARIANTS[name].overrides, f"runner.max_steps={steps}", "runner.val_before_train=false",
                         "runner.val_check_interval=0", "runner.save_interval=0", "runner.sample_log_interval=0"],
                        out / "calibration" / name)
        seconds[name] = statistics.median([r["time/step"] for r in records(run_dir) if "time/step" in r][1:])
        print(f"  {name:<16} {seconds[name]:6.2f} s/step", flush=True)
    previous = json.loads((out / "calibration.json").read_text()) if (out / "calibration.json").is_file() else {}
    (out / "calibration.json").write_text(json.dumps({**previous, **seconds}, indent=1))
    return {**previous, **seconds}


def seconds_of(name: str, seconds: dict[str, float]) -> float | None:
    return seconds.get(VARIANTS[name].speed_of or name)


def run_dir_of(out: Path, name: str, seed: int) -> Path:
    return out / "runs" / f"{name}-seed{seed}"


def curve(out: Path, name: str, seed: int) -> dict[int, float]:
    """Held-out reward by step of a finished run ({} if it has not run, or is still running: its last eval is not at
    its config's ``runner.max_steps``)."""
    logs = run_dir_of(out, name, seed)
    found = [p for p in logs.iterdir() if p.is_dir()] if logs.is_dir() else []
    points = {r["step"]: r["eval/avg"] for r in records(found[0]) if "eval/avg" in r} if found else {}
    config = found[0] / "config.yaml" if found else None
    if points and config and config.is_file() and max(points) < OmegaConf.load(config).runner.max_steps:
        return {}
    return points


def report(names: list[str], seeds: list[int], out: Path, seconds: dict[str, float]) -> str:
    """A markdown table: held-out reward every EVAL_EVERY steps and at the end, per run, and its mean over seeds."""
    curves = {(name, seed): curve(out, name, seed) for name in names for seed in seeds}
    longest = max((max(c) for c in curves.values() if c), default=0)
    columns = list(range(0, longest, EVAL_EVERY))
    lines = ["| variant | seed | steps | min | " + " | ".join(f"{s}" for s in columns) + " | end | gain |",
             "|---" * (len(columns) + 6) + "|"]

    def row(label: str, seed: str, steps: str, minutes: str, points: dict, last: float, gain: float) -> str:
        cells = [f"{points[s]:.3f}" if s in points else "" for s in columns]
        return f"| {label} | {seed} | {steps} | {minutes} | " + " | ".join(cells) + f" | {last:.3f} | {gain:+.3f} |"

    for name in names:
        done = [(seed, curves[name, seed]) for seed in seeds if curves[name, seed]]
        per_step = seconds_of(name, seconds)
        for seed, points in done:
            end = max(points)
            minutes = f"{end * per_step / 60:.1f}" if per_step else ""
            lines.append(row(VARIANTS[name].description, str(seed), str(end), minutes, points, points[end],
                             points[end] - points[0]))
        if len(done) > 1:
            shared = set.intersection(*(set(points) for _, points in done))
            means = {s: statistics.mean(points[s] for _, points in done) for s in shared}
            last = statistics.mean(points[max(points)] for _, points in done)
            gains = [points[max(points)] - points[0] for _, points in done]
            lines.append(row(f"**{VARIANTS[name].description}: mean of {len(done)} seeds**", "", "", "", means, last,
                             statistics.mean(gains)))
    return "\n".join(lines)


def gains(names: list[str], seeds: list[int], out: Path, seconds: dict[str, float]) -> str:
    """A markdown table, a row per variant: its steps, seconds per step, each seed's held-out gain (blank: not
    run) and their mean over the seeds run (blank for one)."""
    lines = ["| variant | steps | s/step | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
             "|---" * (len(seeds) + 4) + "|"]
    for name in names:
        curves = [curve(out, name, seed) for seed in seeds]
        gained = [c[max(c)] - c[0] if c else None for c in curves]
        done = [g for g in gained if g is not None]
        if not done:
            continue
        per_step = seconds_of(name, seconds)
        cells = ["" if g is None else f"{g:+.3f}" for g in gained]
        mean = f"{statistics.mean(done):+.3f}" if len(done) > 1 else ""
        lines.append(f"| {VARIANTS[name].description} | {max(max(c) for c in curves if c)} | "
                     f"{f'{per_step:.2f}' if per_step else ''} | " + " | ".join(cells) + f" | {mean} |")
    return "\n".join(lines)


def fixed_steps(items: list[str], parser: argparse.ArgumentParser) -> dict[str, int]:
    """``--steps awm=83 ...`` as {variant: steps}; a bad item is a usage error that names it."""
    steps = {}
    for item in items:
        name, _, count = item.partition("=")
        if name not in VARIANTS or not count.isdigit() or int(count) < 1:
            parser.error(f"--steps {item!r}: expected VARIANT=N with N >= 1 and VARIANT one of the --variants choices")
        steps[name] = int(count)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[42])
    parser.add_argument("--calibration-steps", type=int, default=4)
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
    parser.add_argument("--max-steps", type=int, default=0, help="stop each run here (a control up to CI's length)")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides for every run that leave training as it is "
                        "(e.g. runner.save_interval=75 to resume from there with more evals)")
    parser.add_argument("--steps", nargs="*", default=[], metavar="VARIANT=N",
                        help="a variant's steps instead of its calibrated share of the budget (a recipe's max_steps)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench_runs" / "algorithms")
    parser.add_argument("--calibrate-only", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="reuse the calibration and runs under --out")
    args = parser.parse_args()
    fixed = fixed_steps(args.steps, parser)
    calibrated = [name for name in args.variants if name not in fixed]
    # the `nft` variant's seconds per step set the budget of every variant whose steps are not given
    names = list(dict.fromkeys(["nft", *calibrated])) if calibrated or args.calibrate_only else []
    calibration = args.out / "calibration.json"
    seconds = json.loads(calibration.read_text()) if calibration.is_file() else {}
    missing = [name for name in names if seconds_of(name, seconds) is None]
    if missing and not args.report_only:
        print(f"calibrating ({args.calibration_steps} steps each):", flush=True)
        seconds = calibrate(missing, args.calibration_steps, args.out)
    budget = {name: max(1, round(SHIPPED_STEPS * seconds["nft"] / seconds_of(name, seconds)))
              for name in names if seconds_of(name, seconds) is not None}
    if budget:
        print("steps within the budget of " + f"{SHIPPED_STEPS} NFT steps ({SHIPPED_STEPS * seconds['nft'] / 60:.1f} "
              "min): " + ", ".join(f"{name} {budget[name]}" for name in budget), flush=True)
    budget.update(fixed)
    if args.calibrate_only:
        return
    names = [n for n in args.variants if n in budget]
    if not args.report_only:
        jobs = [(name, seed) for name in names for seed in args.seeds if not run_dir_of(args.out, name, seed).exists()]

        def run(job: tuple[str, int]) -> None:
            name, seed = job
            steps = min(budget[name], args.max_steps or budget[name])
            train([*VARIANTS[name].overrides, f"runner.max_steps={steps}", f"runner.seed={seed}", f"actor.seed={seed}",
                   f"runner.val_check_interval={EVAL_EVERY}", "runner.save_interval=0", *args.extra],
                  run_dir_of(args.out, name, seed))
            print(f"  done: {name} seed {seed}", flush=True)

        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            list(pool.map(run, jobs))
    # the command that ran them (a --report-only call reports the runs of an earlier one)
    command = args.out / "command.txt"
    if not args.report_only or not command.is_file():
        command.write_text(f"bin/rlrunner python bench/algorithms.py {' '.join(sys.argv[1:])}\n")
    tables = [f"Measured {provenance()}: `{command.read_text().strip()}`",
              report(names, args.seeds, args.out, seconds), gains(names, args.seeds, args.out, seconds)]
    print("\n" + "\n\n".join(tables), flush=True)
    (args.out / "table.md").write_text("\n\n".join(tables) + "\n")


if __name__ == "__main__":
    main()

"""The device check: rlrunner's GPU path measured and exercised on random-weight models, with nothing downloaded.

Run it through bench/gpu_check.sh (which picks the Python and, with ``--offline``, installs the prepared wheels):

    bash bench/gpu_check.sh --prepare .gpu_check                 # here, with the registry (bench/gpu_prepare.py)
    bash bench/gpu_check.sh --offline .gpu_check --out "$OUT"    # on the lent GPU: no network, no Ray
    bash bench/gpu_check.sh --out DIR                            # a GPU whose Python has rlrunner's requirements
    bash bench/gpu_check.sh --tiny --out DIR                     # the same code on CPU with tiny folders (CI)

It builds each random-weight model folder just before the first part that needs it (bench/gpu_folders.py: denoisers
and VAEs at the size of bench/model_configs/, text encoders thinned to one layer with their real output widths) in
a scratch folder (not under --out, removed at the end unless --keep-models), then runs each part in its own process,
so that a failing part is recorded and the next one still runs:

  ddp     sd3_nft_ocr's step in one process on one device (bench/gpu_parts.py): actor (DDP over a one-rank group)
          and rollout collocated with offload; rollout of the recipe's group of 24 at 512 px (10-step DPM-Solver++),
          VAE decode, OCR reward, NFT update, EMA, weight sync, the offload round trip, phase by phase
  fsdp2   the same with the actor on FSDP2 over a one-rank mesh
  wan     wan22_ti2v_5b_nft_video_ocr's step the same way (a group of 8 videos of 5 frames at 512 px)
  runner, qwen  (only with --parts) sd3_nft_ocr / qwen_image_nft_ocr through the launcher: 2 steps, eval + save, resume

Each phase's peak of allocated device memory stands beside what ``bin/rlrunner plan --simulate`` predicts for the same
settings (from the prepared folder's simulated.json; without --prepared the check simulates first, on the CPU).
After every part <out>/gpu_check.json (rows, phases, versions, the GPU) and <out>/gpu_check.md (the tables) are
rewritten; the parts' output goes to <out>/gpu_check.log and each part's rows to <out>/<part>.json: at most 8 files,
so that all of them come back from a lent machine. The exit status is 1 when any part failed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu_launched import LAUNCHED, run_process, write_atomically  # bench/ is not a package: imported by path
from gpu_parts import PARTS, PHASES

#: Qwen-Image blocks built (of 60) for the qwen part: enough to exercise fsdp2 + offload; tiny folders have 1
QWEN_LAYERS = {"full": 12, "tiny": 1}
DEFAULT_PARTS = tuple(PARTS)
ALL_PARTS = (*PARTS, *LAUNCHED)
#: seconds the parts may take on the lent GPU (its 6 minutes less the install and the start); a part that would
#: start later is skipped, one that runs over is stopped
FULL_BUDGET_S = 330.0
#: seconds the parts' simulation may take without --prepared (three at full size: about 5 CPU-minutes)
SIMULATION_TIMEOUT_S = 1800.0
#: seconds one part may take, its model folder included (on the lent GPU: a hang costs this, not the budget)
PART_TIMEOUT_S = {"full": 200.0, "tiny": 600.0}
#: modules the lent image lacks (the prepared wheels bring them) -> their distributions: versions and where from
CARRIED = {"diffusers": "diffusers", "omegaconf": "omegaconf", "rapidocr": "rapidocr", "Levenshtein": "levenshtein"}
COLUMNS = ("Part", "# GPUs", "Images", "Throughput (images/GPU/s)", "Time per Step (s)", "Peak memory (GiB)",
           "Simulated peak (GiB)", "MFU", "Status")
PHASE_COLUMNS = ("Part", "Phase", "Seconds", "Peak allocated (GiB)", "Simulated peak (GiB)", "Measured / simulated",
                 "Rise in the phase (GiB)", "Simulated activations (GiB)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="device check of rlrunner (random weights, nothing downloaded)",
                                epilog=f"parts: {', '.join(ALL_PARTS)} (bench/gpu_check.py says what each runs)")
    p.add_argument("--tiny", action="store_true", help="tiny folders on CPU: checks the script itself (CI)")
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                   help=f"comma-separated parts in order (default {','.join(DEFAULT_PARTS)}; also "
                        f"{','.join(LAUNCHED)})")
    p.add_argument("--out", type=Path, default=None, help="results folder (default logs/gpu_check-<time>)")
    p.add_argument("--prepared", type=Path, default=None,
                   help="bench/gpu_check.sh --prepare's folder: the simulations of the parts' settings (default: "
                        "simulate here first)")
    p.add_argument("--models", type=Path, default=None,
                   help="model folders: reused where present, else built here (default: a scratch folder, removed "
                        "at the end unless --keep-models)")
    p.add_argument("--keep-models", action="store_true", help="keep the built model folders for a rerun")
    p.add_argument("--qwen-layers", type=int, default=None,
                   help=f"Qwen-Image blocks of 60 (default {QWEN_LAYERS['full']}; tiny: {QWEN_LAYERS['tiny']})")
    p.add_argument("--gpus", type=int, default=1, help="devices of the launched parts (needs --backend ray over 1)")
    p.add_argument("--backend", default="local", choices=("local", "ray"),
                   help="cluster.backend of the launched parts (default local: in-process, no Ray)")
    p.add_argument("--part-timeout", type=float, default=None,
                   help=f"seconds per part, its model folder included (default {PART_TIMEOUT_S['full']:.0f}; "
                        f"--tiny: {PART_TIMEOUT_S['tiny']:.0f})")
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds for all parts, folders included (default {FULL_BUDGET_S:.0f}; --tiny: none)")
    args = p.parse_args(argv)
    args.parts = [part for part in args.parts.split(",") if part]
    unknown = [part for part in args.parts if part not in ALL_PARTS]
    if unknown or not args.parts:
        p.error(f"--parts {','.join(unknown) or '(none)'}: choose from {','.join(ALL_PARTS)}")
    if args.gpus > 1 and args.backend == "local":
        p.error(f"--gpus {args.gpus} needs --backend ray: the in-process backend runs one rank per group")
    args.qwen_layers = args.qwen_layers or QWEN_LAYERS["tiny" if args.tiny else "full"]
    args.budget = args.budget or (None if args.tiny else FULL_BUDGET_S)
    args.part_timeout = args.part_timeout or PART_TIMEOUT_S["tiny" if args.tiny else "full"]
    return args


def _command_output(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False, timeout=60).stdout.strip()
    except OSError:  # no such tool here (nvidia-smi on a CPU machine)
        return ""


def environment() -> dict[str, Any]:
    """Versions and the device, for the record next to the numbers (no CUDA context in this process: the GPU's
    name comes from nvidia-smi, so that the parts' memory is theirs alone); where each carried module came from."""
    import torch
    import transformers

    carried = {}
    for name, distribution in CARRIED.items():
        try:
            module = importlib.import_module(name)
            carried[name] = f"{importlib.metadata.version(distribution)} from {Path(module.__file__).parent}"
        except ImportError as err:
            carried[name] = f"not importable: {err}"
    gpus = _command_output(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]).splitlines()
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": gpus[0] if gpus else "none (CPU)",
            "gpu_count": len(gpus), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "python_executable": sys.executable, "carried": carried,
            "ray": "importable" if importlib.util.find_spec("ray") else "not importable",
            "rlrunner_commit": _command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])}


def say(out: Path, text: str) -> None:
    """A progress line on the console and in <out>/gpu_check.log (beside the parts' output)."""
    print(text, flush=True)
    with (out / "gpu_check.log").open("a") as log:
        log.write(text + "\n")


def family_of(part: str) -> str:
    return PARTS[part].family if part in PARTS else LAUNCHED[part][1]


def build_model(args: argparse.Namespace, family: str, log: Path, timeout: float) -> str | None:
    """The folder of ``family`` under --models (reused when present); an error line, or None."""
    if (args.models / family / "model_index.json").is_file():
        return None
    command = [sys.executable, str(ROOT / "bench" / "gpu_folders.py"), "--out", str(args.models), "--families", family,
               "--layers", f"qwen_image={args.qwen_layers}", *(["--tiny"] if args.tiny else [])]
    say(args.out, f"gpu_check: building {family} under {args.models}")
    status, error = run_process(command, log, timeout)
    return None if status == 0 else (error if status is None else f"exit {status}: {error}")


def simulate_here(args: argparse.Namespace, folder: Path, log: Path) -> Path | None:
    """Without --prepared: the in-process parts' simulations, computed now on the CPU (bench/gpu_prepare.py)."""
    parts = [p for p in args.parts if p in PARTS]
    if not parts:
        return None
    say(args.out, f"gpu_check: simulating {','.join(parts)} on the CPU (plan --simulate; --prepared skips this)")
    command = [sys.executable, str(ROOT / "bench" / "gpu_prepare.py"), "--out", str(folder), "--simulations-only",
               "--parts", ",".join(parts), *(["--tiny"] if args.tiny else [])]
    status, error = run_process(command, log, SIMULATION_TIMEOUT_S)
    if status != 0:
        say(args.out, f"gpu_check: no simulation, the parts run without it: {error}")
        return None
    return folder


def check_prepared(folder: Path, tiny: bool) -> None:
    """A prepared folder made for the other sizes cannot be compared: say how to prepare the right one."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest} is missing: bash bench/gpu_check.sh --prepare {folder} makes the folder")
    prepared_tiny = json.loads(manifest.read_text()).get("tiny")
    if prepared_tiny != tiny:
        raise ValueError(f"{folder} was prepared {'with' if prepared_tiny else 'without'} --tiny; prepare it again "
                         f"{'with' if tiny else 'without'} --tiny to compare this run's sizes")


def child_command(args: argparse.Namespace, part: str, scratch: Path, prepared: Path | None,
                  timeout: float) -> list[str]:
    command = [sys.executable, str(ROOT / "bench" / "gpu_parts.py"), part, "--out", str(args.out), "--models",
               str(args.models), "--scratch", str(scratch), "--gpus", str(args.gpus), "--backend", args.backend,
               "--timeout", str(timeout - 10)]  # the part ends before its kill
    return command + (["--prepared", str(prepared)] if prepared else []) + (["--tiny"] if args.tiny else [])


def failed_row(part: str, status: str) -> dict[str, Any]:
    return {"part": part, "gpus": None, "images": None, "images_per_gpu_s": None, "s_per_step": None,
            "peak_gib": None, "simulated_gib": None, "mfu": None, "status": status}


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(rows: list[dict[str, Any]], memory: str) -> str:
    """verl-omni's throughput table (markdown) of ``rows``, with the simulated peak and MFU."""
    lines = ["| " + " | ".join(COLUMNS).replace("Peak memory", f"Peak {memory} memory") + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        values = (r["part"], _cell(r["gpus"], "d"), _cell(r["images"], "d"), _cell(r["images_per_gpu_s"], ".3f"),
                  _cell(r["s_per_step"], ".2f"), _cell(r["peak_gib"], ".3g"), _cell(r.get("simulated_gib"), ".3g"),
                  _cell(r.get("mfu"), ".1%"), r["status"])
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def phase_table(phases: dict[str, dict[str, dict[str, Any]]], device: bool) -> str:
    """Per part and phase: seconds, the allocated peak (device only) and the simulation's peak and activations."""
    lines = ["| " + " | ".join(PHASE_COLUMNS) + " |", "|" + "|".join("---" for _ in PHASE_COLUMNS) + "|"]
    for part, by_phase in phases.items():
        for name in PHASES:
            if name not in by_phase:
                continue
            p = by_phase[name]
            peak = p["peak_gib"] if device else None
            sim = p.get("simulated_gib")
            rise = peak - p["start_gib"] if device and p.get("start_gib") is not None else None
            values = (part, name, " / ".join(f"{s:.2f}" for s in p["seconds"]), _cell(peak, ".3g"), _cell(sim, ".3g"),
                      _cell(peak / sim if peak is not None and sim else None, ".2f"), _cell(rise, ".3g"),
                      _cell(p.get("simulated_activations_gib"), ".3g"))
            lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def write_report(out: Path, report: dict[str, Any]) -> None:
    """gpu_check.json and gpu_check.md, rewritten after every part."""
    device = report["memory"] == "device"
    write_atomically(out / "gpu_check.json", json.dumps(report, indent=2))
    env = report["environment"]
    write_atomically(
        out / "gpu_check.md",
        f"# rlrunner device check, {env['date']}\n\n{env['gpu']}; torch {env['torch']} (CUDA {env['cuda']}); "
        f"python {env['python']}; commit {env['rlrunner_commit']}; {report['seconds']} s\n\n"
        f"{table(report['rows'], report['memory'])}\n\nPhases (allocated device memory beside plan --simulate; "
        f"seconds of each call):\n\n{phase_table(report['phases'], device)}\n")


def run_parts(args: argparse.Namespace, scratch: Path, prepared: Path | None, report: dict[str, Any]) -> None:
    """Each part in its own process, its model folder built first; the report rewritten after each."""
    log, start = args.out / "gpu_check.log", time.perf_counter()
    for part in args.parts:
        left = None if args.budget is None else args.budget - (time.perf_counter() - start)
        if left is not None and left < 30:
            report["skipped"].append(part)
            report["rows"].append(failed_row(part, f"SKIPPED: the --budget of {args.budget:.0f}s was spent"))
            continue
        timeout = args.part_timeout if left is None else min(args.part_timeout, left)
        say(args.out, f"gpu_check: part {part}" + ("" if left is None else f" ({left:.0f}s of the budget left)"))
        part_start = time.perf_counter()
        error = build_model(args, family_of(part), log, timeout)
        if error:
            report["rows"].append(failed_row(part, f"FAILED: model folder {family_of(part)} not built: {error}"))
        else:
            result_file = args.out / f"{part}.json"
            result_file.unlink(missing_ok=True)
            timeout -= time.perf_counter() - part_start
            status, error = run_process(child_command(args, part, scratch, prepared, timeout), log, timeout)
            result = json.loads(result_file.read_text()) if result_file.is_file() else {}
            rows = result.get("rows", [])
            if status != 0 and all(r["status"] == "ok" for r in rows):  # killed or crashed after its last row
                rows.append(failed_row(part, f"FAILED: {error if status is None else f'exit {status}: {error}'}"))
            report["rows"] += rows
            report["phases"][part] = result.get("phases", {})
        report["seconds"] = round(time.perf_counter() - start)
        write_report(args.out, report)
        say(args.out, f"gpu_check: part {part} done in {time.perf_counter() - part_start:.0f}s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tiny:  # on CPU even where a GPU is present: the parts and the runs they launch inherit this
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    args.out = (args.out or ROOT / "logs" / time.strftime("gpu_check-%Y%m%d-%H%M%S")).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="rlrunner-gpu-check-"))
    models_given = args.models is not None
    args.models = (args.models or scratch / "models").resolve()
    args.models.mkdir(parents=True, exist_ok=True)
    if args.prepared:
        check_prepared(args.prepared.resolve(), args.tiny)
    env = environment()
    say(args.out, f"gpu_check: {env['gpu']} | torch {env['torch']} (CUDA {env['cuda']}) | diffusers "
                  f"{env['carried']['diffusers']} | ray {env['ray']} | commit {env['rlrunner_commit']} | results in "
                  f"{args.out}")
    prepared = args.prepared.resolve() if args.prepared else simulate_here(args, scratch / "prepared",
                                                                           args.out / "gpu_check.log")
    memory = "host" if args.tiny or not env["gpu_count"] else "device"
    report: dict[str, Any] = {"environment": env, "tiny": args.tiny, "memory": memory, "parts": args.parts,
                              "prepared": str(prepared) if prepared else None, "seconds": 0, "skipped": [],
                              "rows": [], "phases": {}}
    write_report(args.out, report)
    try:
        run_parts(args, scratch, prepared, report)
    finally:
        shutil.rmtree(scratch / "prepared", ignore_errors=True)
        if models_given or args.keep_models:
            say(args.out, f"gpu_check: model folders kept in {args.models}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    rows = report["rows"]
    print("\n" + table(rows, memory) + "\n\n" + phase_table(report["phases"], memory == "device") + "\n", flush=True)
    failed = [r["part"] for r in rows if r["status"] != "ok" and not r["status"].startswith("SKIPPED")]
    say(args.out, f"gpu_check: {len(rows) - len(failed)} of {len(rows)} rows ok in {report['seconds']}s; "
                  f"{'FAILED: ' + ', '.join(failed) if failed else 'all parts passed'}; {args.out / 'gpu_check.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())

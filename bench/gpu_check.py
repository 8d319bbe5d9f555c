"""The device check: rlrunner's GPU path measured and exercised end to end, with nothing downloaded.

Run it from the repository root with a CUDA torch environment active (bench/gpu_check.sh picks the Python):

    bash bench/gpu_check.sh                      # one GPU, real sizes: <= 8 minutes on an 80-141 GB GPU
    bash bench/gpu_check.sh --skip-qwen          # any part can be skipped: --skip-{sd3,runner,qwen,wan}
    bash bench/gpu_check.sh --tiny               # the same code on CPU with the model tests' tiny folders (CI)

It first writes random-weight model folders (bench/gpu_folders.py: denoisers and VAEs at the size of
bench/model_configs/, text encoders thinned to one layer with their real output widths), then runs each part in
its own process, so that one failing part is recorded in the table and the others still run:

  sd3     SD3.5-Medium as sd3_nft_ocr sets it up: a group of 10-step DPM-Solver++ rollouts at 512 px (+ VAE decode)
          with the EMA adapter, then NFT optimizer steps (micro-batches with accumulation, AdamW, clip, EMA)
  runner  the whole runner: sd3_nft_ocr through the launcher for 2 steps on one GPU (NCCL group of 1), eval and
          checkpoint at step 2, then a second launch resumes from that checkpoint to step 3
  qwen    qwen_image_nft_ocr the same way (actor.strategy fsdp2: on one GPU over a one-rank mesh; cluster.enable_offload),
          --qwen-layers blocks
  wan     Wan2.2 TI2V-5B rollouts + NFT steps as an image model (1 frame) and a video model (5 frames)

Runs use small prompt counts (the script writes its own prompts) and score with rapidocr on the CPU. The table
(markdown, verl-omni's columns: images/GPU/s, s/step, peak memory per part; for the launched runs also the per-device
peak ``bin/rlrunner plan --simulate`` predicts for the same settings, on the CPU) is printed and written to
<out>/gpu_check.json with the versions and the GPU; the exit status is 1 when any part failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu_parts import run_process  # bench/ is not a package: imported by path

PARTS_SCRIPT = ROOT / "bench" / "gpu_parts.py"
#: Qwen-Image blocks built (of 60): enough to exercise fsdp2 + offload within the time; tiny folders have 1
QWEN_LAYERS = {"full": 12, "tiny": 1}
#: part -> (the model folder it needs, what it runs); bench/gpu_parts.py runs each
PARTS: dict[str, tuple[str, str]] = {
    "sd3": ("sd3", "SD3.5-Medium rollout + NFT training throughput, peak memory"),
    "runner": ("sd3", "sd3_nft_ocr through the launcher: 2 steps, eval + save at step 2, resume to step 3"),
    "qwen": ("qwen_image", "qwen_image_nft_ocr (fsdp2, enable_offload): 2 steps, eval + save, resume"),
    "wan": ("wan22_ti2v_5b", "Wan2.2 TI2V-5B image and video (5 frames) rollout + NFT training throughput"),
}
COLUMNS = ("Part", "# GPUs", "Images", "Throughput (images/GPU/s)", "Time per Step (s)", "Peak memory (GiB)",
           "Simulated peak (GiB)", "Status")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="device check of rlrunner (random weights, nothing downloaded)",
                                epilog="parts: " + "; ".join(f"{k}: {v[1]}" for k, v in PARTS.items()))
    p.add_argument("--tiny", action="store_true", help="tiny folders on CPU: checks the script itself (CI)")
    for part in PARTS:
        p.add_argument(f"--skip-{part}", action="store_true", help=f"skip part {part}")
    p.add_argument("--out", type=Path, default=None, help="results folder (default logs/gpu_check-<time>)")
    p.add_argument("--models", type=Path, default=None,
                   help="model folders: reused where present, else built here (default <out>/models, removed at "
                        "the end unless --keep-models)")
    p.add_argument("--keep-models", action="store_true", help="keep the built model folders for a rerun")
    p.add_argument("--qwen-layers", type=int, default=None,
                   help=f"Qwen-Image blocks of 60 (default {QWEN_LAYERS['full']}; tiny: {QWEN_LAYERS['tiny']})")
    p.add_argument("--gpus", type=int, default=1, help="devices of the runner parts (fsdp2 shards over them)")
    p.add_argument("--part-timeout", type=float, default=600.0, help="seconds per part and for building the models")
    args = p.parse_args(argv)
    args.qwen_layers = args.qwen_layers or QWEN_LAYERS["tiny" if args.tiny else "full"]
    return args


def _command_output(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False, timeout=60).stdout.strip()
    except OSError:  # no such tool here (nvidia-smi on a CPU machine)
        return ""


def environment() -> dict[str, Any]:
    """Versions and the device, for the record next to the numbers (no CUDA context in this process: the GPU's
    name comes from nvidia-smi, so that the parts' memory is theirs alone)."""
    import diffusers
    import torch
    import transformers

    gpus = _command_output(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]).splitlines()
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": gpus[0] if gpus else "none (CPU)",
            "gpu_count": len(gpus), "torch": torch.__version__, "cuda": torch.version.cuda,
            "diffusers": diffusers.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(),
            "rlrunner_commit": _command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])}


def build_models(args: argparse.Namespace, parts: list[str], models: Path, log: Path) -> str | None:
    """The folders the parts need (those already under ``models`` are reused); an error line, or None."""
    needed = sorted({PARTS[p][0] for p in parts} - {f.name for f in models.glob("*") if (f / "model_index.json").
                                                       is_file()})
    if not needed:
        return None
    command = [sys.executable, str(ROOT / "bench" / "gpu_folders.py"), "--out", str(models), "--families", *needed,
               "--layers", f"qwen_image={args.qwen_layers}", *(["--tiny"] if args.tiny else [])]
    print(f"gpu_check: building {', '.join(needed)} under {models}", flush=True)
    return run_logged(command, log, args.part_timeout)


def run_logged(command: list[str], log: Path, timeout: float) -> str | None:
    """Run ``command`` (output in ``log``, its 'gpu_' lines echoed); an error line, or None when it succeeded."""
    status, error = run_process(command, log, timeout)
    return None if status == 0 else (error if status is None else f"exit {status}: {error}")


def child_command(args: argparse.Namespace, part: str) -> list[str]:
    command = [sys.executable, str(PARTS_SCRIPT), part, "--out", str(args.out), "--models", str(args.models),
               "--gpus", str(args.gpus), "--timeout", str(args.part_timeout - 10)]  # the part ends before its kill
    return command + (["--tiny"] if args.tiny else [])


def failed_row(part: str, error: str) -> dict[str, Any]:
    return {"part": part, "gpus": None, "images": None, "images_per_gpu_s": None, "s_per_step": None,
            "peak_gib": None, "simulated_gib": None, "status": f"FAILED: {error}"}


def table(rows: list[dict[str, Any]], memory: str) -> str:
    """verl-omni's throughput table (markdown) of ``rows``."""
    def cell(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = ["| " + " | ".join(COLUMNS).replace("Peak memory", f"Peak {memory} memory") + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        values = (r["part"], cell(r["gpus"], "d"), cell(r["images"], "d"), cell(r["images_per_gpu_s"], ".3f"),
                  cell(r["s_per_step"], ".2f"), cell(r["peak_gib"], ".1f"), cell(r.get("simulated_gib"), ".1f"),
                  r["status"])
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tiny:  # on CPU even where a GPU is present: the parts and the runs they launch inherit this
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    args.out = (args.out or ROOT / "logs" / time.strftime("gpu_check-%Y%m%d-%H%M%S")).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    built_here = args.models is None
    args.models = (args.models or args.out / "models").resolve()
    args.models.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(f"gpu_check: {env['gpu']} | torch {env['torch']} (CUDA {env['cuda']}) | diffusers {env['diffusers']} | "
          f"commit {env['rlrunner_commit']} | results in {args.out}", flush=True)
    parts = [p for p in PARTS if not getattr(args, f"skip_{p}")]
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    build_error = build_models(args, parts, args.models, args.out / "build.log")
    for part in parts:
        print(f"gpu_check: part {part}: {PARTS[part][1]}", flush=True)
        if build_error and not (args.models / PARTS[part][0] / "model_index.json").is_file():
            rows.append(failed_row(part, f"model folders not built: {build_error}"))
            continue
        result = args.out / f"{part}.json"
        result.unlink(missing_ok=True)
        part_start = time.perf_counter()
        error = run_logged(child_command(args, part), args.out / f"{part}.log", args.part_timeout)
        part_rows = json.loads(result.read_text()) if result.is_file() else []
        rows += part_rows or [failed_row(part, error or "wrote no result")]
        print(f"gpu_check: part {part} {'FAILED' if error else 'done'} in {time.perf_counter() - part_start:.0f}s",
              flush=True)
    memory = "host" if args.tiny or not env["gpu_count"] else "device"
    report = {"environment": env, "tiny": args.tiny, "memory": memory, "seconds": round(time.perf_counter() - start),
              "skipped": [p for p in PARTS if p not in parts], "rows": rows}
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print("\n" + table(rows, memory) + "\n", flush=True)
    failed = [r["part"] for r in rows if r["status"] != "ok"]
    print(f"gpu_check: {len(rows) - len(failed)} of {len(rows)} rows ok in {report['seconds']}s; "
          f"{'FAILED: ' + ', '.join(failed) if failed else 'all parts passed'}; {args.out / 'gpu_check.json'}")
    if built_here and not args.keep_models:
        shutil.rmtree(args.models, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())

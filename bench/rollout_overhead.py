"""Rollout overhead: our sampling loop vs. the diffusers pipeline's own call, same model, steps and batch.

Both paths run the same transformer (with the EMA LoRA adapter active), the same Euler sigma grid and the same
precomputed prompt embeddings and starting noise, without CFG, and return latents (no text encoding, no VAE):
what differs is only the loop around the transformer. The ratio ``ours / diffusers`` should be <= 1.05.

    .venv/bin/python bench/rollout_overhead.py                      # tiny random pipelines of every family, on CPU
    .venv/bin/python bench/rollout_overhead.py --family sd3 --model-path stabilityai/stable-diffusion-3.5-medium \\
        --resolution 512 --steps 10 --batch 8 --precision bf16          # a real checkpoint on a GPU
    .venv/bin/python bench/rollout_overhead.py --quick              # seconds, tiny sizes: checks the script runs
                                                                    # (tests/project/test_bench_scripts.py)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests" / "helpers"))  # tests/helpers/family_helpers.py: noise, prompt batches, the diffusers reference

from family_helpers import encode_prompt_batch, make_noise, pipeline_sample

from rlrunner.models import EMA_ADAPTER, MODEL_FAMILIES, model_class
from rlrunner.utils.device import resolve_device, resolve_dtype

TARGET = 1.05
#: the diffusers families (tiny is rlrunner's own model: no pipeline to compare with)
FAMILIES = [family for family in MODEL_FAMILIES if family != "tiny"]
#: --quick: one family, the fewest samples, steps and repeats (2 steps: qwen_image's terminal shift divides by zero
#: on a 1-step grid)
QUICK = {"family": "sd3", "steps": 2, "batch": 1, "repeats": 1}


def _tiny_writers():
    """The tiny pipeline writers of the model tests (tests/helpers/tiny_pipelines.py)."""
    import tiny_pipelines

    return tiny_pipelines


def _sync(device: torch.device) -> None:
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and backend is not None and hasattr(backend, "synchronize"):
        backend.synchronize()


def _time(fn, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def build(family: str, model_path: str | None, args: argparse.Namespace, workdir: Path):
    """Load ``family`` from ``model_path`` (or a freshly written tiny pipeline) with the bench settings."""
    from omegaconf import OmegaConf

    from rlrunner.recipe import ModelConfig

    family_cfg = OmegaConf.structured(ModelConfig())[family]
    if model_path is None:
        tiny = _tiny_writers()
        model_path = str(tiny.TINY_WRITERS[family](workdir / family))
        family_cfg.merge_with(tiny.TINY_FAMILY_SETTINGS[family])
        family_cfg.merge_with({"lora_rank": 4, "lora_alpha": 8})
    if args.resolution:
        family_cfg.resolution = args.resolution
    if args.num_frames:
        family_cfg.num_frames = args.num_frames
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.precision, device)
    return model_class(family).load(model_path, family_cfg, device=device, dtype=dtype)


def bench_family(family: str, args: argparse.Namespace, workdir: Path) -> float:
    model = build(family, args.model_path, args, workdir)
    cond = encode_prompt_batch(model, [f'a sign that says "{i % 4}"' for i in range(args.batch)])
    noise = make_noise(model, args.batch, torch.Generator(model.device).manual_seed(0))
    ours = lambda: model.sample(cond, noise, sampler="euler", num_steps=args.steps, adapter=EMA_ADAPTER)
    theirs = lambda: pipeline_sample(model, cond, noise, num_steps=args.steps, adapter=EMA_ADAPTER)
    max_diff = (ours() - theirs().float()).abs().max().item()  # also the warm-up of both paths
    times = {"ours": [], "diffusers": []}
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits both alike
        times["ours"].append(_time(ours, model.device))
        times["diffusers"].append(_time(theirs, model.device))
    t_ours, t_diffusers = statistics.median(times["ours"]), statistics.median(times["diffusers"])
    ratio = t_ours / t_diffusers
    print(f"{family:14s} batch {args.batch} steps {args.steps} {model.dtype} on {model.device}: "
          f"ours {t_ours * 1e3:8.2f} ms  diffusers {t_diffusers * 1e3:8.2f} ms  ratio {ratio:.3f} "
          f"(target <= {TARGET})  max |x0 diff| {max_diff:.2e}", flush=True)
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="all", help="a family of the tiny pipelines (tests/helpers/tiny_pipelines.py), "
                                                        "or all")
    parser.add_argument("--model-path", default=None, help="diffusers folder or hub id (default: tiny random)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15, help="timed runs of each path (median reported)")
    parser.add_argument("--resolution", type=int, default=0, help="pixels (default: the family's tiny setting)")
    parser.add_argument("--num-frames", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="bf16", help="bf16 | fp16 | fp32 (half falls back to fp32 on CPU)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--quick", action="store_true", help=f"seconds, tiny sizes {QUICK}: checks that the script "
                                                             "runs (flags given beside it still win)")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args()
    torch.set_num_threads(args.threads)
    families = FAMILIES if args.family == "all" else [args.family]
    if args.model_path and len(families) > 1:
        parser.error("--model-path needs --family")
    with tempfile.TemporaryDirectory() as workdir:
        ratios = [bench_family(f, args, Path(workdir)) for f in families]
    worst = max(ratios)
    print(f"worst ratio {worst:.3f}: {'OK' if worst <= TARGET else 'ABOVE TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Export a trained adapter from a checkpoint for use in a diffusers pipeline.

    python -m rlrunner.export logs/<run>/checkpoints/global_step_N --out my_lora [--adapter ema]
    python -m rlrunner.export logs/<run> --out my_lora          # newest complete checkpoint of the run

The output folder holds ``pytorch_lora_weights.safetensors`` (diffusers' LoRA format) and a README naming the
base model, so that ``pipe = <Pipeline>.from_pretrained(base); pipe.load_lora_weights(out)`` applies it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from rlrunner.checkpoint import ADAPTER_DIRS, MANIFEST, CheckpointError, resolve_resume_dir


def export_adapter(checkpoint: str, out: str, adapter: str = "default") -> Path:
    """Copy ``adapter`` of ``checkpoint`` (a global_step_N dir or a run's log dir) to ``out``; returns ``out``."""
    if adapter not in ADAPTER_DIRS:
        raise ValueError(f"unknown adapter {adapter!r}; valid: {sorted(ADAPTER_DIRS)}")
    path = resolve_resume_dir(checkpoint, Path("."), "")
    if not (path / MANIFEST).is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint ({MANIFEST} is missing)")
    source = path / ADAPTER_DIRS[adapter]
    if not source.is_dir():
        raise CheckpointError(f"{path} has no {ADAPTER_DIRS[adapter]}/ folder")
    manifest = json.loads((path / MANIFEST).read_text())
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        shutil.copy2(file, out_dir / file.name)
    (out_dir / "README.md").write_text(
        f"# LoRA adapter ({adapter}) trained with rlrunner (DiffusionNFT)\n\n"
        f"- base model: `{manifest['model_path']}` (model_type `{manifest['model_type']}`)\n"
        f"- LoRA rank {manifest['lora_rank']}, alpha {manifest['lora_alpha']}\n"
        f"- from checkpoint `{path}` (global step {manifest['global_step']})\n\n"
        f"Load with `pipe.load_lora_weights(\"{out_dir}\")` on the base model's diffusers pipeline.\n"
    )
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlrunner.export", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="global_step_N directory, or a run's log dir (newest checkpoint)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--adapter", default="default", choices=sorted(ADAPTER_DIRS),
                        help="default: the trained adapter; ema: the EMA (old) policy")
    args = parser.parse_args(argv)
    try:
        out = export_adapter(args.checkpoint, args.out, args.adapter)
    except (CheckpointError, ValueError) as err:
        print(f"rlrunner: error: {err}", file=sys.stderr)
        return 2
    print(f"exported the {args.adapter} adapter to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

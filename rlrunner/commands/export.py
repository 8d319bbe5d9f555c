"""Export a trained adapter from a checkpoint, with a card that says how to load it.

    bin/rlrunner export logs/<run>/checkpoints/global_step_N --out my_lora [--adapter ema]
    bin/rlrunner export logs/<run> --out my_lora          # the run's newest checkpoint that reads back

The output folder holds ``pytorch_lora_weights.safetensors`` (diffusers' LoRA format), ``model.yaml`` (the run's
``actor.model`` block with absolute paths and ``lora_path`` set to this folder, for rlrunner's ``build_model``) and
a card naming the algorithm, the base model and how to load it: with the family's diffusers pipeline, or with
rlrunner for the tiny model, which has no diffusers pipeline.

The card is ``README.md``, unless the folder already holds a README.md that an export did not write: that one is
the user's and stays; the card is then ``RLRUNNER_CARD.md``. Only the files the export writes are made readable by
all (0644); other files of an existing folder keep their modes (a 0600 ``.netrc`` stays private).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from omegaconf import OmegaConf

from rlrunner.config.paths import REPO_DIR
from rlrunner.models import model_class
from rlrunner.run.checkpoint import ADAPTER_DIRS, MANIFEST, CheckpointError
from rlrunner.run.checkpoint_index import checkpoint_at

ALGORITHM_TITLES = {"nft": "DiffusionNFT", "flow_grpo": "FlowGRPO", "awm": "AWM, Advantage Weighted Matching"}
# families without a diffusers pipeline of their own (the tiny model saves its LoRA in diffusers' format only)
RLRUNNER_ONLY_FAMILIES = ("tiny",)
CARD_TITLE = "# LoRA adapter ("  # how every card begins: a README.md that does not was written by someone else
CARD_FALLBACK = "RLRUNNER_CARD.md"  # the card's name beside a user's own README.md


def card_file(out_dir: Path) -> Path:
    """Where the card goes in ``out_dir``: README.md when absent or a card of an earlier export, else
    :data:`CARD_FALLBACK`."""
    readme = out_dir / "README.md"
    if not readme.is_file():
        return readme
    with readme.open(encoding="utf-8", errors="replace") as text:
        first = text.readline()
    return readme if first.startswith(CARD_TITLE) and "trained with rlrunner" in first else out_dir / CARD_FALLBACK


def base_model_location(model_path: str) -> str:
    """``model_path`` as an absolute folder (relative paths are taken from here, then from the repository root,
    where the launcher runs), or unchanged when no such folder exists: a hub id."""
    path = Path(model_path).expanduser()
    for candidate in (path, REPO_DIR / path):
        if candidate.is_dir():
            return str(candidate.resolve())
    return model_path


def model_card(algorithm: str, adapter: str, manifest: dict, base: str, checkpoint: Path, out_dir: Path) -> str:
    """The exported folder's README: what trained the adapter, on which base model, and how to load it."""
    model_type = manifest["model_type"]
    lines = [
        f"{CARD_TITLE}{adapter}) trained with rlrunner ({ALGORITHM_TITLES.get(algorithm, algorithm)})\n",
        f"- algorithm: `{algorithm}`",
        f"- base model: `{base}` (model_type `{model_type}`)",
        f"- LoRA rank {manifest['lora_rank']}, alpha {manifest['lora_alpha']}",
        f"- from checkpoint `{checkpoint}` (global step {manifest['global_step']})\n",
    ]
    if model_type not in RLRUNNER_ONLY_FAMILIES:
        family = model_class(model_type)
        pipeline = family.pipeline_class_name
        lines += ["With diffusers:\n", "```python", f"from diffusers import {pipeline}",
                  f"pipe = {pipeline}.from_pretrained({base!r})", *diffusers_load_lines(family, out_dir), "```\n"]
    else:
        lines.append(f"The `{model_type}` model is rlrunner's own (no diffusers pipeline); load it with rlrunner.\n")
    lines += [
        "With rlrunner (in the environment the launcher uses: `bin/rlrunner python` in the rlrunner checkout):\n",
        "```python",
        "import torch",
        "from omegaconf import OmegaConf",
        "from rlrunner.models import build_model",
        f"model = build_model(OmegaConf.load({str(out_dir / 'model.yaml')!r}))  # base model + this adapter",
        "prompts = ['a sign that says \"2345\"']",
        "x0 = model.sample(model.encode_prompts(prompts), torch.randn(len(prompts), *model.latent_shape),",
        "                  sampler='euler', num_steps=10, adapter='default')",
        "images = model.decode(x0)  # uint8 [B, H, W, 3]",
        "```",
        "",
        f"In a recipe: `actor.model.model_path={base} actor.model.{model_type}.lora_path={out_dir}` starts from it.",
    ]
    return "\n".join(lines) + "\n"


def diffusers_load_lines(family: type, out_dir: Path) -> list[str]:
    """One ``pipe.load_lora_weights`` call per LoRA file of the family that ``out_dir`` holds (every file the family
    may write while it holds none yet). A two-expert model writes ``pytorch_lora_weights_transformer_2.safetensors``
    for its second expert, loaded with ``load_into_transformer_2=True``; with ``train_experts`` high or low only one
    of its two files exists."""
    calls = family.lora_load_calls
    held = [kw for kw in calls if (out_dir / kw.get("weight_name", "pytorch_lora_weights.safetensors")).is_file()]
    return [f"pipe.load_lora_weights({str(out_dir)!r}{''.join(f', {k}={v!r}' for k, v in kw.items())})"
            for kw in held or calls]


def export_adapter(checkpoint: str, out: str, adapter: str = "default") -> Path:
    """Copy ``adapter`` of ``checkpoint`` (a global_step_N dir or a run's log dir, taken by the rules of
    :mod:`rlrunner.run.checkpoint_index`) to ``out`` with its card (:func:`card_file`) and ``model.yaml``; the files
    written are readable by all (0644), others in ``out`` are left as they are. Returns ``out`` as an absolute
    path."""
    if adapter not in ADAPTER_DIRS:
        raise ValueError(f"unknown adapter {adapter!r}; valid: {sorted(ADAPTER_DIRS)}")
    path = checkpoint_at(checkpoint, f"checkpoint {checkpoint!r}")  # read back: complete, every file opens
    source = path / ADAPTER_DIRS[adapter]
    if not source.is_dir():
        raise CheckpointError(f"{path} has no {ADAPTER_DIRS[adapter]}/ folder")
    manifest = json.loads((path / MANIFEST).read_text())
    config = OmegaConf.load(path / "config.yaml")
    out_dir = Path(out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for file in source.iterdir():
        written.append(Path(shutil.copyfile(file, out_dir / file.name)))  # not copy2: they may be private (0600)
    base = base_model_location(manifest["model_path"])
    model_cfg = config.actor.model
    model_cfg.model_path = base
    model_cfg[model_cfg.model_type].lora_path = str(out_dir)
    written.append(out_dir / "model.yaml")
    written[-1].write_text(OmegaConf.to_yaml(model_cfg))
    written.append(card_file(out_dir))
    written[-1].write_text(model_card(str(config.algorithm.name), adapter, manifest, base, path.resolve(), out_dir))
    for file in written:
        file.chmod(0o644)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bin/rlrunner export", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint",
                        help="global_step_N directory, or a run's log dir (its newest checkpoint that reads back)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--adapter", default="default", choices=sorted(ADAPTER_DIRS),
                        help="default: the trained adapter; ema: the EMA (old) policy")
    args = parser.parse_args(argv)
    try:
        out = export_adapter(args.checkpoint, args.out, args.adapter)
    except (CheckpointError, ValueError) as err:
        print(f"rlrunner: error: {err}", file=sys.stderr)
        return 2
    print(f"exported the {args.adapter} adapter to {out} (how to load it: {card_file(out)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

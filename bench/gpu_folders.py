"""Random-weight diffusers pipeline folders for bench/gpu_check.sh, with nothing downloaded.

Each folder is built from a config-only folder: ``bench/model_configs/<name>/`` (the published checkpoints' configs)
at real size, or, with ``--tiny``, the tiny pipelines of the model tests (tests/helpers/tiny_pipelines.py). The same code
builds both; only the configs differ:

* the denoiser and the VAE at their configured size (Qwen-Image: ``--qwen-layers`` of its 60 blocks, to fit the
  time of a device check), random weights;
* every text encoder thinned to one layer over a small in-memory vocabulary, keeping its real output widths, so
  the conditioning has the shapes the denoiser expects at a fraction of the size;
* tokenizers built in memory (tests/helpers/family_helpers.py), a default scheduler of the pipeline's class.

Weights are created on ``--device`` (a GPU initialises 20 GB in seconds) and saved with the pipeline's own
``save_pretrained``: denoiser and text encoders in bf16, VAE in fp32, as rlrunner loads them.

    python bench/gpu_folders.py --out /tmp/models                 # sd3, wan22_ti2v_5b, qwen_image at real size
    python bench/gpu_folders.py --out /tmp/models --tiny          # the tiny folders, on CPU in seconds
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests" / "helpers"))  # tests/helpers/family_helpers.py: the in-memory tokenizers
CONFIGS = ROOT / "bench" / "model_configs"
#: family -> config-only folder of the published checkpoint under bench/model_configs/
SOURCES = {"sd3": "stable-diffusion-3.5-medium", "wan22_ti2v_5b": "wan2.2-ti2v-5b", "qwen_image": "qwen-image",
           "flux1": "flux.1-dev",
           "wan21_t2v": "wan2.1-t2v-14b", "wan22_t2v_a14b": "wan2.2-t2v-a14b"}
#: scheduler of each pipeline class as the published folders configure it (rlrunner samples on its own grid)
SCHEDULERS: dict[str, dict[str, Any]] = {
    "StableDiffusion3Pipeline": {"shift": 3.0},
    "WanPipeline": {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 5.0},
    "QwenImagePipeline": {},
    "FluxPipeline": {key: value for key, value in json.loads(
        (CONFIGS / "flux.1-dev" / "scheduler" / "scheduler_config.json").read_text()).items() if key[0] != "_"},
}
#: text encoder config keys that count layers (CLIP, T5/UMT5, Qwen2.5-VL text / vision towers)
LAYER_KEYS = ("num_hidden_layers", "num_layers", "depth")


def tiny_pipelines() -> Any:
    """The model tests' tiny writers and settings (tests/helpers/tiny_pipelines.py), imported when asked for: only
    ``--tiny`` needs them."""
    import tiny_pipelines

    return tiny_pipelines


def read_config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


def tokenizer_for(class_name: str, encoder_config: dict[str, Any]) -> Any:
    """An in-memory tokenizer of ``class_name`` (tests/helpers/family_helpers.py; no hub access)."""
    import family_helpers

    if class_name == "CLIPTokenizer":
        return family_helpers.clip_tokenizer(int(encoder_config["max_position_embeddings"]))
    if class_name in ("T5TokenizerFast", "T5Tokenizer"):
        return family_helpers.t5_tokenizer()
    if class_name in ("Qwen2Tokenizer", "Qwen2TokenizerFast"):
        return family_helpers.qwen_tokenizer()
    raise ValueError(f"no in-memory tokenizer for {class_name}; add one to bench/gpu_folders.py tokenizer_for")


def thin_text_encoder(class_name: str, config: dict[str, Any], tokenizer: Any) -> Any:
    """``class_name`` with one layer per tower over ``tokenizer``'s vocabulary; every width as configured."""
    import transformers

    fields = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("architectures", "model_type")}
    for key in LAYER_KEYS:
        if key in fields:
            fields[key] = 1
    vision = dict(fields.get("vision_config") or {})
    if vision:
        vision["depth"] = 1
        fields["vision_config"] = vision
    if isinstance(fields.get("text_config"), dict):  # a saved nested config: thin the text tower there
        fields["text_config"] = {**fields["text_config"], "num_hidden_layers": 1, "vocab_size": len(tokenizer)}
    # the special tokens of this tokenizer (CLIP pools at its end-of-text token; ids must be in the vocabulary)
    fields.update(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    encoder_config = transformers.AutoConfig.for_model(config["model_type"], **fields)
    return getattr(transformers, class_name)(encoder_config)


def write_configs(pipe: Any, out: Path) -> Path:
    """``pipe``'s ``model_index.json`` and each component's config and tokenizer files, no weights: what
    ``bin/rlrunner plan --simulate`` reads, with the configs ``save_pretrained`` would write."""
    pipe.save_config(out)
    for name, component in pipe.components.items():
        if hasattr(component, "save_config"):  # diffusers models and schedulers
            component.save_config(out / name)
        elif hasattr(getattr(component, "config", None), "save_pretrained"):  # transformers models
            component.config.save_pretrained(out / name)
        elif hasattr(component, "save_pretrained"):  # tokenizers
            component.save_pretrained(out / name)
    return out


def build_folder(source: Path, out: Path, *, device: torch.device, num_layers: int | None = None,
                 configs_only: bool = False) -> Path:
    """Write the pipeline of ``source`` (model_index.json + <component>/config.json) with random weights to ``out``.

    ``num_layers`` replaces the denoiser's block count, of each expert of a two-expert model (None keeps the
    config's). ``configs_only``: the same pipeline built on the meta device, its config files written and no weights
    (bench/gpu_prepare.py simulates the device check's folders so, before any GPU is at hand).
    """
    import diffusers

    index = json.loads((source / "model_index.json").read_text())
    pipeline_class = index["_class_name"]
    parts: dict[str, Any] = {}
    encoders = {name: spec for name, spec in index.items() if name.startswith("text_encoder") and spec[0]}
    torch.manual_seed(0)
    with torch.device("meta" if configs_only else device):
        for name, (library, class_name) in encoders.items():
            config = read_config(source / name)
            tokenizer = tokenizer_for(index[name.replace("text_encoder", "tokenizer")][1], config)
            parts[name.replace("text_encoder", "tokenizer")] = tokenizer
            parts[name] = thin_text_encoder(class_name, config, tokenizer).to(torch.bfloat16)
        for name in [n for n in ("transformer", "transformer_2", "vae") if (index.get(n) or [None])[0]]:
            config = read_config(source / name)
            if name.startswith("transformer") and num_layers is not None:
                config["num_layers"] = num_layers
            module = getattr(diffusers, index[name][1]).from_config(config)
            parts[name] = module.to(torch.float32 if name == "vae" else torch.bfloat16)
    parts["scheduler"] = getattr(diffusers, index["scheduler"][1])(**SCHEDULERS[pipeline_class])
    for name, value in index.items():  # pipeline options (Wan: expand_timesteps) and absent components
        if not name.startswith("_") and name not in parts:
            parts[name] = None if isinstance(value, list) else value
    pipe = getattr(diffusers, pipeline_class)(**parts)
    if configs_only:
        return write_configs(pipe, out)
    pipe.save_pretrained(out)
    return out


def family_sources(tiny: bool, workdir: Path) -> dict[str, Path]:
    """family -> config folder: the published configs, or the model tests' tiny pipelines written under workdir."""
    if not tiny:
        return {family: CONFIGS / name for family, name in SOURCES.items()}
    writers = tiny_pipelines().TINY_WRITERS
    return {family: writers[family](workdir / f"tiny-{family}") for family in SOURCES}


def build_all(out: Path, *, tiny: bool, device: torch.device, layers: dict[str, int] | None = None,
              families: tuple[str, ...] = tuple(SOURCES), configs_only: bool = False) -> dict[str, Path]:
    """Every family's folder under ``out/<family>``, ``layers[family]`` denoiser blocks where given (``configs_only``:
    config files, no weights); prints one line per folder."""
    layers = layers or {}
    with tempfile.TemporaryDirectory() as scratch:
        sources = family_sources(tiny, Path(scratch))
        built = {}
        for family in families:
            start = time.perf_counter()
            built[family] = build_folder(sources[family], out / family, device=device, num_layers=layers.get(family),
                                         configs_only=configs_only)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            print(f"gpu_folders: {family} -> {built[family]} in {time.perf_counter() - start:.0f}s", flush=True)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="random-weight pipeline folders for bench/gpu_check.sh")
    parser.add_argument("--out", type=Path, required=True, help="folder that receives one sub-folder per family")
    parser.add_argument("--tiny", action="store_true", help="the tiny pipelines of the model tests (CPU, seconds)")
    parser.add_argument("--device", default=None, help="where weights are initialised (default: cuda if present)")
    parser.add_argument("--layers", nargs="+", default=[], metavar="FAMILY=N",
                        help="denoiser blocks of a family, e.g. qwen_image=12 (default: as configured)")
    parser.add_argument("--families", nargs="+", default=list(SOURCES), choices=list(SOURCES))
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    layers = {}
    for item in args.layers:
        family, _, count = item.partition("=")
        if family not in SOURCES or not count.isdigit():
            parser.error(f"--layers {item!r}: expected FAMILY=N with FAMILY one of {list(SOURCES)}")
        layers[family] = int(count)
    build_all(args.out, tiny=args.tiny, device=device, layers=layers, families=tuple(args.families))
    return 0


if __name__ == "__main__":
    sys.exit(main())

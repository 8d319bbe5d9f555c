"""A tiny random CLIP scorer folder (``CLIPModel`` + byte-level ``CLIPTokenizer`` + image processor config), for the
CPU recipe ``tiny_nft_pickscore_clipscore`` and the tests: ``python -m rlrunner.rewards.clip.tiny <folder>``.

The tokenizer has no merges: every byte is a token (``c`` inside a word, ``c</w>`` at its end), then
``<|startoftext|>`` and ``<|endoftext|>`` as the two highest ids, as in CLIP's real vocabulary.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

TEXT_CONTEXT = 32
IMAGE_SIZE = 28
PATCH = 14
LOGIT_SCALE = 100.0  # exp(logit_scale) of trained CLIPs (PickScore_v1's too): pickscore = 100 · cos / 26


def byte_vocab() -> dict[str, int]:
    """CLIP's byte-to-unicode alphabet, each symbol alone and with ``</w>``, then the two special tokens."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(tokens)}


def tiny_clip_config(vocab_size: int, eos_token_id: int, width: int = 32) -> object:
    from transformers import CLIPConfig

    common = {"hidden_size": width, "intermediate_size": 2 * width, "num_hidden_layers": 1, "num_attention_heads": 2,
              "hidden_act": "gelu"}
    text = {**common, "vocab_size": vocab_size, "max_position_embeddings": TEXT_CONTEXT,
            "bos_token_id": eos_token_id - 1, "eos_token_id": eos_token_id, "pad_token_id": eos_token_id}
    return CLIPConfig(text_config=text, vision_config={**common, "image_size": IMAGE_SIZE, "patch_size": PATCH},
                      projection_dim=16)


def write_tokenizer(folder: Path) -> None:
    """``vocab.json``, an empty ``merges.txt`` and the processor config (resize 28, crop 28, openai mean/std)."""
    from .loading import OPENAI_MEAN, OPENAI_STD

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(byte_vocab()))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": IMAGE_SIZE},
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "image_mean": list(OPENAI_MEAN),
        "image_std": list(OPENAI_STD)}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "CLIPTokenizer", "model_max_length": TEXT_CONTEXT, "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}))


def write_random_tiny_clip(folder: str | Path, seed: int = 0) -> Path:
    """Write a random tiny ``CLIPModel`` with its tokenizer to ``folder``; returns the folder."""
    from transformers import CLIPModel

    folder = Path(folder)
    write_tokenizer(folder)
    vocab = byte_vocab()
    torch.manual_seed(seed)
    model = CLIPModel(tiny_clip_config(len(vocab), vocab["<|endoftext|>"]))
    with torch.no_grad():
        model.logit_scale.fill_(math.log(LOGIT_SCALE))
    model.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    print(write_random_tiny_clip(sys.argv[1] if len(sys.argv) > 1 else "tiny-clip"))

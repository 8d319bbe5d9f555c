"""Networks and on-disk layout of the ``tiny`` model family (torch + diffusers only, no other rlrunner imports).

The tiny family is a grayscale pixel-space rectified-flow model that renders short strings at 32x96 so that a
laptop (or CI) can watch DiffusionNFT raise an OCR reward without a GPU or downloaded weights:

* :class:`CharTextEncoder` turns the quoted target text of a prompt into one embedding per character *slot*
  (character embedding + slot position embedding + one small transformer layer), ``[B, L, D]``. Slot ``i``
  is always the ``i``-th character, so the denoiser can learn "pixel column ↔ slot" through cross-attention.
* the denoiser is a stock diffusers :class:`~diffusers.UNet2DConditionModel` at tiny size whose input is the
  noisy image plus two fixed coordinate channels (x and y in [-1, 1]), a 2-D pixel position signal that the
  convolutions alone would not have, plus *slot channels*: every pixel column also gets the embedding of the
  character slot it lies in (the renders put character ``i`` in a fixed slot, :data:`SLOT_WIDTH` pixels wide
  from :data:`LEFT_MARGIN`). Cross-attention alone learned "which slot goes where" slowly: 3,000 pretraining
  steps drew the right digits in a wrong order. :func:`tiny_velocity` is the one place that adds both.

Folder layout written by :func:`save_tiny_components` (``save_pretrained`` of each part, safetensors)::

    model_index.json      class names + the rlrunner settings (resolution, alphabet, coordinate channels, slot layout)
    unet/                 UNet2DConditionModel
    text_encoder/         CharTextEncoder
    README.md             model card (written by scripts/pretrain_tiny.py)

The pretraining script imports this module directly, so it runs before/without the rest of rlrunner.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin, UNet2DConditionModel
from diffusers.configuration_utils import register_to_config
from torch import nn

from rlrunner.models.meta import MODEL_INDEX, read_config_file

#: digits without 0 and 1 (the OCR engine confuses them with O / I)
DEFAULT_ALPHABET = "23456789"
PAD_ID, UNK_ID = 0, 1
NUM_COORD_CHANNELS = 2
#: layout of the rendered strings (``scripts/pretrain_tiny.py``): character ``i`` is centred in pixel columns
#: ``[LEFT_MARGIN + i * SLOT_WIDTH, LEFT_MARGIN + (i + 1) * SLOT_WIDTH)``
SLOT_WIDTH = 14
LEFT_MARGIN = 6


def target_text(prompt: str) -> str:
    """The first double-quoted span of ``prompt`` (the whole prompt if it has none), spaces removed."""
    parts = prompt.split('"')
    text = parts[1] if len(parts) >= 3 else prompt
    return text.replace(" ", "")


class CharTextEncoder(ModelMixin, ConfigMixin):
    """Character-level text encoder: ``token ids [B, L] -> embeddings [B, L, dim]``.

    Args:
        alphabet: the characters with their own embedding (ids ``2..``); anything else is ``<unk>`` (id 1),
            an empty slot is ``<pad>`` (id 0). Upper/lower case are folded with :meth:`str.upper`.
        max_length: number of character slots ``L``; longer texts are cut.
        dim: embedding width ``D`` (the UNet's ``cross_attention_dim``).
        num_layers: transformer encoder layers over the slots (0 = plain character + position embeddings).
        num_heads: attention heads of those layers.
    """

    @register_to_config
    def __init__(self, alphabet: str = DEFAULT_ALPHABET, max_length: int = 8, dim: int = 64, num_layers: int = 1,
                 num_heads: int = 4) -> None:
        super().__init__()
        self.char_emb = nn.Embedding(len(alphabet) + 2, dim)
        self.pos_emb = nn.Parameter(torch.randn(max_length, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, num_heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.layers = nn.ModuleList([layer] + [_clone(layer) for _ in range(num_layers - 1)]) if num_layers else []
        self.norm = nn.LayerNorm(dim)
        self._char_to_id = {c: i + 2 for i, c in enumerate(alphabet.upper())}

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        """Character ids of ``texts`` (already the target strings): int64 ``[B, max_length]`` on CPU."""
        ids = torch.full((len(texts), self.config.max_length), PAD_ID, dtype=torch.long)
        for row, text in enumerate(texts):
            for col, char in enumerate(text.upper()[: self.config.max_length]):
                ids[row, col] = self._char_to_id.get(char, UNK_ID)
        return ids

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: int64 ``[B, L]`` with ``L <= max_length``. Returns ``[B, L, dim]``."""
        h = self.char_emb(ids) + self.pos_emb[: ids.shape[1]].to(self.char_emb.weight.dtype)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)

    def encode(self, prompts: list[str]) -> torch.Tensor:
        """Prompts -> slot embeddings ``[B, max_length, dim]`` (the quoted span of each prompt is the text)."""
        ids = self.tokenize([target_text(p) for p in prompts]).to(self.char_emb.weight.device)
        return self.forward(ids)


def _clone(layer: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(layer)


def build_tiny_unet(resolution: tuple[int, int] = (32, 96), channels: tuple[int, ...] = (32, 64, 96),
                    patch_size: int = 4, cross_attention_dim: int = 64, heads: int = 4) -> UNet2DConditionModel:
    """A tiny UNet2DConditionModel on ``patch_size``-unshuffled pixels.

    The image ``[B, 1, H, W]`` is folded into ``[B, p*p, H/p, W/p]`` cells (pixel-unshuffle, like a DiT's
    patches) and two coordinate channels are appended, so the UNet runs at 8x24 for 32x96 images; every level
    and the mid block cross-attend to the character slots. ``only_cross_attention`` drops self-attention over
    cells (the convolutions already mix neighbours). The input also carries ``cross_attention_dim`` slot
    channels (see :func:`slot_channels`). The patch size is stored as ``out_channels = p*p``.
    """
    height, width = resolution
    if height % (patch_size * 2 ** (len(channels) - 1)) or width % (patch_size * 2 ** (len(channels) - 1)):
        raise ValueError(f"resolution {resolution} must be divisible by patch_size * 2**(levels - 1) = "
                         f"{patch_size * 2 ** (len(channels) - 1)}")
    n = len(channels)
    return UNet2DConditionModel(
        sample_size=(height // patch_size, width // patch_size),
        in_channels=patch_size**2 + NUM_COORD_CHANNELS + cross_attention_dim,
        out_channels=patch_size**2,
        down_block_types=("CrossAttnDownBlock2D",) * n,
        up_block_types=("CrossAttnUpBlock2D",) * n,
        block_out_channels=tuple(channels),
        layers_per_block=1,
        norm_num_groups=8,
        cross_attention_dim=cross_attention_dim,
        attention_head_dim=heads,
        only_cross_attention=True,
        act_fn="silu",
    )


def coord_channels(batch: int, height: int, width: int, *, device: torch.device | str | None = None,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Fixed pixel coordinates ``[B, 2, H, W]``: channel 0 = x, channel 1 = y, both in [-1, 1]."""
    ys = torch.linspace(-1.0, 1.0, height, device=device, dtype=dtype)
    xs = torch.linspace(-1.0, 1.0, width, device=device, dtype=dtype)
    grid = torch.stack([xs[None, :].expand(height, width), ys[:, None].expand(height, width)])
    return grid[None].expand(batch, -1, -1, -1)


def slot_channels(text_emb: torch.Tensor, height: int, width: int, patch_size: int) -> torch.Tensor:
    """Each cell column's character slot embedding, ``[B, D, height, width]`` (cells, not pixels).

    A cell column belongs to the slot its centre pixel falls in (:data:`LEFT_MARGIN`, :data:`SLOT_WIDTH`);
    columns left of the first slot or right of the last one get zeros.
    """
    num_slots = text_emb.shape[1]
    centres = torch.arange(width, device=text_emb.device) * patch_size + (patch_size - 1) / 2
    slot = torch.div(centres - LEFT_MARGIN, SLOT_WIDTH, rounding_mode="floor").long()
    inside = ((slot >= 0) & (slot < num_slots)).to(text_emb.dtype)
    columns = text_emb[:, slot.clamp(0, num_slots - 1)] * inside[None, :, None]  # [B, width, D]
    return columns.transpose(1, 2)[:, :, None, :].expand(-1, -1, height, -1)


def tiny_velocity(unet: nn.Module, x_t: torch.Tensor, t: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
    """Velocity ``v = eps - x0`` predicted at ``x_t``.

    Args:
        unet: the tiny UNet (possibly LoRA-wrapped).
        x_t: noisy images ``[B, 1, H, W]`` in the model dtype.
        t: sigmas ``[B]`` in [0, 1] (1 = pure noise); the UNet sees ``1000 * t`` as its timestep.
        text_emb: character slot embeddings ``[B, L, D]``.
    Returns:
        ``[B, 1, H, W]``.
    """
    p = patch_size_of(unet)
    cells = F.pixel_unshuffle(x_t, p)
    b, _, h, w = cells.shape
    text_emb = text_emb.to(x_t.dtype)
    inp = torch.cat([cells, coord_channels(b, h, w, device=x_t.device, dtype=x_t.dtype),
                     slot_channels(text_emb, h, w, p)], dim=1)
    if inp.shape[1] != unet.config.in_channels:
        raise ValueError(f"tiny UNet expects {unet.config.in_channels} input channels, got {inp.shape[1]} "
                         f"({p * p} pixel + {NUM_COORD_CHANNELS} coordinate + {text_emb.shape[-1]} slot channels): "
                         f"the model folder predates slot channels or does not match its text encoder")
    out = unet(inp, t.to(x_t.dtype) * 1000.0, encoder_hidden_states=text_emb).sample
    return F.pixel_shuffle(out, p)


def patch_size_of(unet: nn.Module) -> int:
    """The pixel-unshuffle factor ``p`` of a tiny UNet (its ``out_channels`` is ``p * p``)."""
    return math.isqrt(int(unet.config.out_channels))


def save_tiny_components(path: str, unet: UNet2DConditionModel, text_encoder: CharTextEncoder,
                         extra: dict[str, Any] | None = None) -> None:
    """Write the diffusers-style folder (``unet/``, ``text_encoder/``, ``model_index.json``) to ``path``."""
    os.makedirs(path, exist_ok=True)
    unet.save_pretrained(os.path.join(path, "unet"), safe_serialization=True)
    text_encoder.save_pretrained(os.path.join(path, "text_encoder"), safe_serialization=True)
    index = {
        "_class_name": "TinyFlowModel",
        "_rlrunner_family": "tiny",
        "unet": ["diffusers", "UNet2DConditionModel"],
        "text_encoder": ["rlrunner.models.tiny_text", "CharTextEncoder"],
        "resolution": [int(s) * patch_size_of(unet) for s in unet.config.sample_size],
        "patch_size": patch_size_of(unet),
        "alphabet": text_encoder.config.alphabet,
        "coord_channels": NUM_COORD_CHANNELS,
        "slot_layout": {"left_margin": LEFT_MARGIN, "slot_width": SLOT_WIDTH},
        "prediction": "flow velocity v = eps - x0, x_t = (1 - t) x0 + t eps, timestep = 1000 t",
        "pixel_range": [-1.0, 1.0],
    }
    index.update(extra or {})
    with open(os.path.join(path, MODEL_INDEX), "w") as f:
        json.dump(index, f, indent=2)


def load_tiny_components(
    path: str, dtype: torch.dtype = torch.float32, text_encoder: bool = True
) -> tuple[UNet2DConditionModel, CharTextEncoder | dict[str, Any], dict[str, Any]]:
    """Read a folder written by :func:`save_tiny_components`; errors name the missing file. Without
    ``text_encoder`` only the text encoder's config (a dict) is read, not its weights."""
    index_file = os.path.join(path, MODEL_INDEX)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tiny model folder {path!r} does not exist; set actor.model.model_path to a folder "
                                f"made by scripts/pretrain_tiny.py (shipped: examples/diffusion/models/tiny-ocr-flow)")
    for needed in (index_file, os.path.join(path, "unet"), os.path.join(path, "text_encoder")):
        if not os.path.exists(needed):
            raise FileNotFoundError(f"{needed!r} is missing: {path!r} is not a tiny model folder (expected "
                                    f"{MODEL_INDEX}, unet/ and text_encoder/ as written by scripts/pretrain_tiny.py)")
    index = read_config_file(Path(index_file), "the tiny model's component list")
    unet = UNet2DConditionModel.from_pretrained(os.path.join(path, "unet"), torch_dtype=dtype)
    text_folder = os.path.join(path, "text_encoder")
    if not text_encoder:
        return unet, dict(CharTextEncoder.load_config(text_folder)), index
    return unet, CharTextEncoder.from_pretrained(text_folder, torch_dtype=dtype), index


def write_random_tiny(directory: str, resolution: tuple[int, int] = (16, 32), channels: tuple[int, ...] = (8, 16),
                      dim: int = 16, seed: int = 0) -> str:
    """Random-weight tiny model folder for tests (same save code as the pretraining script). Returns the path."""
    torch.manual_seed(seed)
    unet = build_tiny_unet(resolution, channels, patch_size=4, cross_attention_dim=dim, heads=2)
    text_encoder = CharTextEncoder(max_length=8, dim=dim, num_heads=2)
    save_tiny_components(str(directory), unet, text_encoder)
    return str(directory)

"""``hpsv2``: HPSv2.1 (an open_clip ViT-H-14 fine-tuned on human preferences) as a ``transformers.CLIPModel``.

``HPS_v2.1_compressed.pt`` holds open_clip's state dict; :func:`open_clip_to_clip` renames its keys into a
``CLIPModel`` (no open_clip or torchvision at run time). Scoring follows HPSv2's ``score`` (tgxs002/HPSv2, also
flow_grpo's ``hpsv2_scorer``): open_clip's eval transform (shorter side to 224, bicubic; centre crop; openai mean/std)
and ``hps = cos(image, text)`` of the projected features, without the logit scale (about 0.2-0.35). Prompts go
through transformers' ``CLIPTokenizer`` of ViT-H-14 (the same BPE vocabulary as open_clip's tokenizer, which also
runs ftfy and HTML unescaping: the same ids for plain text).

Key map (open_clip -> transformers), per tower ``visual.`` -> ``vision_model``, text at the root -> ``text_model``::

    visual.conv1 / class_embedding / positional_embedding / ln_pre / ln_post, visual.proj [W, D]
    transformer.resblocks.N.{ln_1, attn.in_proj_weight [3W, W] (q, k, v), attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}
    token_embedding, positional_embedding, ln_final, text_projection [W, D], logit_scale
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
from torch import nn

from rlrunner.config.schema import RewardConfig

from ..registry import register_reward
from .loading import ImageTransform, hub_or_local_file, is_local, load_tokenizer
from .scores import ClipScoreReward
from .sizes import KNOWN_ARCHITECTURES

HPS_FILE = "HPS_v2.1_compressed.pt"
#: open_clip's ViT-H-14: vision heads of width 80 (1280 / 16), text heads of width 64 (1024 / 16)
VISION_HEAD_WIDTH = 80
TEXT_HEAD_WIDTH = 64
_BLOCK = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
          "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}


def clip_config_of(state: dict[str, torch.Tensor], eos_token_id: int, *, vision_head_width: int = VISION_HEAD_WIDTH,
                   text_head_width: int = TEXT_HEAD_WIDTH) -> Any:
    """The ``CLIPConfig`` of an open_clip state dict, read from its tensor shapes (GELU, LayerNorm eps 1e-5)."""
    from transformers import CLIPConfig

    def layers(prefix: str) -> int:
        found = {int(m.group(1)) for k in state if (m := re.match(rf"{prefix}transformer\.resblocks\.(\d+)\.", k))}
        return max(found) + 1

    v_width, _, patch, _ = state["visual.conv1.weight"].shape
    grid = round((state["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    t_width = state["token_embedding.weight"].shape[1]
    vision = {"hidden_size": v_width, "intermediate_size": state["visual.transformer.resblocks.0.mlp.c_fc.weight"]
              .shape[0], "num_hidden_layers": layers("visual."), "num_attention_heads": v_width // vision_head_width,
              "image_size": grid * patch, "patch_size": patch, "hidden_act": "gelu"}
    text = {"hidden_size": t_width, "intermediate_size": state["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
            "num_hidden_layers": layers(""), "num_attention_heads": t_width // text_head_width,
            "vocab_size": state["token_embedding.weight"].shape[0],
            "max_position_embeddings": state["positional_embedding"].shape[0], "hidden_act": "gelu",
            "eos_token_id": eos_token_id, "bos_token_id": eos_token_id - 1, "pad_token_id": eos_token_id}
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=state["text_projection"].shape[1])


def open_clip_to_clip(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """open_clip's state dict -> ``CLIPModel``'s (``in_proj`` split into q, k, v; projections transposed)."""
    out = {"logit_scale": state["logit_scale"],
           "visual_projection.weight": state["visual.proj"].t(), "text_projection.weight": state["text_projection"].t(),
           "vision_model.embeddings.class_embedding": state["visual.class_embedding"],
           "vision_model.embeddings.patch_embedding.weight": state["visual.conv1.weight"],
           "vision_model.embeddings.position_embedding.weight": state["visual.positional_embedding"],
           "text_model.embeddings.token_embedding.weight": state["token_embedding.weight"],
           "text_model.embeddings.position_embedding.weight": state["positional_embedding"]}
    for src, dst in (("visual.ln_pre", "vision_model.pre_layrnorm"), ("visual.ln_post", "vision_model.post_layernorm"),
                     ("ln_final", "text_model.final_layer_norm")):
        out.update({f"{dst}.{p}": state[f"{src}.{p}"] for p in ("weight", "bias")})
    for key, value in state.items():
        m = re.match(r"(visual\.)?transformer\.resblocks\.(\d+)\.(.+?)[._](weight|bias)$", key)
        if not m:
            continue
        tower, n, name, param = m.groups()
        prefix = f"{'vision_model' if tower else 'text_model'}.encoder.layers.{n}"
        if name == "attn.in_proj":
            for part, chunk in zip(("q", "k", "v"), value.chunk(3, dim=0)):
                out[f"{prefix}.self_attn.{part}_proj.{param}"] = chunk
        else:
            out[f"{prefix}.{_BLOCK[name]}.{param}"] = value
    return out


def load_open_clip_checkpoint(path: str, key: str) -> dict[str, torch.Tensor]:
    """The state dict of an HPS checkpoint (``{"state_dict": ...}`` or a bare state dict; ``module.`` stripped)."""
    ckpt = torch.load(hub_or_local_file(path, HPS_FILE, key), map_location="cpu", weights_only=True)
    state = ckpt.get("state_dict", ckpt)
    state = {k.removeprefix("module."): v for k, v in state.items()}
    missing = [k for k in ("visual.conv1.weight", "token_embedding.weight", "text_projection") if k not in state]
    if missing:
        raise ValueError(f"{key}={path!r} is not an open_clip checkpoint (no {missing}); give HPS_v2.1_compressed.pt "
                         f"from the hub repo xswu/HPSv2")
    return state


@register_reward("hpsv2")
class HpsV2Reward(ClipScoreReward):
    """HPSv2.1: ``cos(image, text)`` of the converted ViT-H-14 (``reward.model_path``: ``HPS_v2.1_compressed.pt``,
    its folder, or the hub id ``xswu/HPSv2``; ``processor_path``: the ViT-H-14 tokenizer)."""

    default_model = "xswu/HPSv2"
    default_processor = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"

    def __init__(self, spec: RewardConfig) -> None:
        if spec.model_path and not spec.processor_path:
            spec = dataclasses.replace(spec, processor_path=self.default_processor)  # a .pt file has no tokenizer
        super().__init__(spec)

    @classmethod
    def architecture(cls, model_path: str) -> Any:
        """open_clip's ViT-H-14 for a hub id; a local checkpoint's shapes (memory-mapped: no weights read)."""
        if not is_local(model_path):
            return KNOWN_ARCHITECTURES["xswu/HPSv2"]
        path = hub_or_local_file(model_path, HPS_FILE, "reward.model_path")
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return clip_config_of({k.removeprefix("module."): v for k, v in ckpt.get("state_dict", ckpt).items()},
                              eos_token_id=1)

    def load(self) -> tuple[nn.Module, Any, ImageTransform]:
        from transformers import CLIPModel

        tokenizer = load_tokenizer(self.processor_path, "reward.processor_path")
        state = load_open_clip_checkpoint(self.model_path, "reward.model_path")
        with torch.device("meta"):
            model = CLIPModel(clip_config_of(state, tokenizer.eos_token_id))
        model.load_state_dict(open_clip_to_clip(state), strict=True, assign=True)
        for embeddings in (model.vision_model.embeddings, model.text_model.embeddings):  # not in any state dict
            embeddings.position_ids = torch.arange(embeddings.position_embedding.num_embeddings).expand((1, -1))
        model = model.to(self.device, self.dtype).eval().requires_grad_(False)
        size = model.config.vision_config.image_size  # HPS's own transform: resize + crop to the model's size
        return model, tokenizer, ImageTransform(size=size, crop=size)

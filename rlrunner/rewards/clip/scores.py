"""``pickscore``, ``clipscore`` and ``aesthetic``: CLIP-embedding rewards on a ``transformers.CLIPModel``.

Each image (each video frame) is scored on its own; frames are chunked like ``video_ocr`` (``frame_interval``) by
:class:`~rlrunner.rewards.image_stats.FrameReward`. Every distinct prompt of a batch is encoded once (a group of
``group_size`` rollouts, and the frames of a video, share one text embedding). Images are preprocessed on the
device (:class:`~rlrunner.rewards.clip.loading.ImageTransform`) in batches of ``reward.batch_size``.

    pickscore  = exp(logit_scale) · cos(text, image) / 26     (PickScore_v1 as flow_grpo / DiffusionNFT scale it)
    clipscore  = cos(text, image)                             (openai/clip-vit-large-patch14)
    aesthetic  = MLP(image / ‖image‖)                         (LAION aesthetic predictor v2 on CLIP ViT-L/14)
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlrunner.config.schema import RewardConfig
from rlrunner.utils.device import PRECISIONS, resolve_device, resolve_dtype

from ..image_stats import FrameReward
from ..registry import register_reward
from .loading import ImageTransform, cached, load_clip_model, load_tokenizer
from .sizes import clip_bytes, clip_config_dict

#: flow_grpo's and DiffusionNFT's PickScore scaling: exp(logit_scale) = 100 puts the score near 0.8-0.9
PICKSCORE_DIVISOR = 26.0


class ClipReward(FrameReward):
    """Base of the CLIP-family rewards: loads ``(model, tokenizer, transform)`` once per process and scores
    ``formula(image_features, text_features)`` in batches.

    Subclasses set ``name``, ``default_model`` (what an empty ``reward.model_path`` means) and implement
    :meth:`formula`; ``uses_text = False`` skips the text tower. Features are L2-normalised ``[N, D]`` float32.
    """

    default_model = ""
    default_processor = ""
    uses_text = True

    def __init__(self, spec: RewardConfig) -> None:
        super().__init__(spec)
        self.model_path = spec.model_path or self.default_model
        # processor_path defaults to model_path, except that the default weights come with their default processor
        default_processor = "" if spec.model_path else self.default_processor
        self.processor_path = spec.processor_path or default_processor or self.model_path
        self.device = resolve_device("auto")  # the env worker's accelerator (Ray gives it its devices), else CPU
        self.dtype = resolve_dtype(spec.precision, self.device)
        key = (type(self).__name__, self.model_path, self.processor_path, spec.head_path, str(self.device), self.dtype)
        self.model, self.tokenizer, self.transform = cached(key, self.load)

    @classmethod
    def architecture(cls, model_path: str) -> Any:
        """The CLIPConfig (or its arguments) of ``model_path`` from config files alone; None when unknown."""
        return clip_config_dict(model_path)

    @classmethod
    def device_memory(cls, spec: RewardConfig) -> list[tuple[str, int, str]]:
        path = spec.model_path or cls.default_model
        config = cls.architecture(path)
        if config is None:
            why = f"not counted: {path} is neither a local folder with config.json nor a known hub id"
            return [(f"{cls.name} scorer", -1, why)]
        nbytes, params = clip_bytes(config, PRECISIONS[spec.precision])
        return [(f"{cls.name} scorer", nbytes, f"{path}: CLIPModel, {params / 1e6:.1f} M parameters in {spec.precision}")]

    def load(self) -> tuple[nn.Module, Any, ImageTransform]:
        """``(CLIPModel, tokenizer, image transform)`` from ``model_path`` / ``processor_path``."""
        model = load_clip_model(self.model_path, "reward.model_path", self.device, self.dtype)
        tokenizer = load_tokenizer(self.processor_path, "reward.processor_path") if self.uses_text else None
        return model, tokenizer, ImageTransform.from_processor(self.processor_path, "reward.processor_path")

    @abstractmethod
    def formula(self, image: torch.Tensor, text: torch.Tensor | None) -> torch.Tensor:
        """Scores ``[N]`` of normalised image features ``[N, D]`` and their prompts' text features ``[N, D]``."""

    @torch.no_grad()
    def image_features(self, images: np.ndarray) -> torch.Tensor:
        pixels = self.transform(images, self.device, self.dtype)
        return _normalised(self.model.get_image_features(pixel_values=pixels).pooler_output)

    @torch.no_grad()
    def text_features(self, prompts: list[str]) -> torch.Tensor:
        tokens = self.tokenizer(prompts, padding="max_length", truncation=True, return_tensors="pt",
                                max_length=self.model.config.text_config.max_position_embeddings).to(self.device)
        return _normalised(self.model.get_text_features(**tokens).pooler_output)

    def score_batch(self, images: np.ndarray, prompts: list[str], reasons: list[str | None]) -> np.ndarray:
        scores = np.zeros(len(images), dtype=np.float32)
        todo = [i for i, r in enumerate(reasons) if r is None]
        if not todo:
            return scores
        texts = None
        if self.uses_text:
            distinct = list(dict.fromkeys(prompts[i] for i in todo))  # a group's prompt is encoded once
            encoded = torch.cat([self.text_features(distinct[s : s + self.spec.batch_size])
                                 for s in range(0, len(distinct), self.spec.batch_size)])
            row = {p: k for k, p in enumerate(distinct)}
        for start in range(0, len(todo), self.spec.batch_size):
            index = todo[start : start + self.spec.batch_size]
            if self.uses_text:
                texts = encoded[[row[prompts[i]] for i in index]]
            with torch.no_grad():
                scores[index] = self.formula(self.image_features(images[index]), texts).float().cpu().numpy()
        return scores


def _normalised(features: torch.Tensor) -> torch.Tensor:
    features = features.float()
    return features / features.norm(dim=-1, keepdim=True)


@register_reward("pickscore")
class PickScoreReward(ClipReward):
    """``exp(logit_scale) · cos(text, image) / 26`` (about 0.7-0.9 for SD3 images; weights
    ``yuvalkirstain/PickScore_v1``, processor ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``)."""

    default_model = "yuvalkirstain/PickScore_v1"
    default_processor = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"

    def formula(self, image: torch.Tensor, text: torch.Tensor | None) -> torch.Tensor:
        return self.model.logit_scale.float().exp() * (image * text).sum(-1) / PICKSCORE_DIVISOR


@register_reward("clipscore")
class ClipScoreReward(ClipReward):
    """``cos(text, image)`` of CLIP ViT-L/14 (about 0.2-0.4; ``openai/clip-vit-large-patch14``)."""

    default_model = "openai/clip-vit-large-patch14"

    def formula(self, image: torch.Tensor, text: torch.Tensor | None) -> torch.Tensor:
        return (image * text).sum(-1)


def aesthetic_mlp(width: int = 768) -> nn.Sequential:
    """The LAION aesthetic predictor v2's head (improved-aesthetic-predictor's ``MLP.layers``; no activations)."""
    return nn.Sequential(nn.Linear(width, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
                         nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))


@register_reward("aesthetic")
class AestheticReward(ClipReward):
    """LAION aesthetic predictor v2: the MLP head (``reward.head_path``, e.g. ``sac+logos+ava1-l14-linearMSE.pth``
    of christophschuhmann/improved-aesthetic-predictor) on the normalised CLIP ViT-L/14 image embedding; about 1-10.
    """

    default_model = "openai/clip-vit-large-patch14"
    uses_text = False
    needs = ("head_path",)

    def __init__(self, spec: RewardConfig) -> None:
        if not spec.head_path:
            raise ValueError("reward.model=aesthetic needs reward.head_path, the MLP head's .pth file, e.g. "
                             "sac+logos+ava1-l14-linearMSE.pth from github.com/christophschuhmann/"
                             "improved-aesthetic-predictor")
        super().__init__(spec)

    @classmethod
    def device_memory(cls, spec: RewardConfig) -> list[tuple[str, int, str]]:
        head = sum(p.numel() for p in aesthetic_mlp().parameters())
        return [*super().device_memory(spec), ("aesthetic MLP head", 4 * head, f"{head / 1e6:.2f} M parameters, fp32")]

    def load(self) -> tuple[nn.Module, Any, ImageTransform]:
        model, _, transform = super().load()
        model.aesthetic_head = load_aesthetic_head(self.spec.head_path, model.config.projection_dim)
        model.aesthetic_head.to(self.device)  # fp32: a 0.9M-parameter head, on normalised fp32 features
        return model, None, transform

    def formula(self, image: torch.Tensor, text: torch.Tensor | None) -> torch.Tensor:
        return self.model.aesthetic_head(image).squeeze(-1)


def load_aesthetic_head(path: str, width: int) -> nn.Sequential:
    """The head's state dict (keys ``layers.0.weight`` ... ``layers.7.bias``) with ``torch.load(weights_only=True)``."""
    if not Path(path).expanduser().is_file():
        raise FileNotFoundError(f"reward.head_path={path!r} does not exist; download the aesthetic head, e.g. "
                                "sac+logos+ava1-l14-linearMSE.pth from github.com/christophschuhmann/"
                                "improved-aesthetic-predictor")
    state = torch.load(Path(path).expanduser(), map_location="cpu", weights_only=True)
    state = {k.removeprefix("layers."): v for k, v in state.items()}
    head = aesthetic_mlp(width)
    head.load_state_dict(state)
    return head.eval().requires_grad_(False)

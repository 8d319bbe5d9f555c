"""CLIP-family rewards on ``transformers`` alone: ``pickscore``, ``clipscore``, ``aesthetic`` (scores.py) and
``hpsv2`` (hps.py, open_clip's HPSv2.1 checkpoint converted into a ``CLIPModel``); loading.py loads the weights,
tokenizers and the image preprocessing."""

from . import hps, scores  # noqa: F401  (modules register themselves)
from .hps import HpsV2Reward, clip_config_of, open_clip_to_clip
from .scores import AestheticReward, ClipReward, ClipScoreReward, PickScoreReward, aesthetic_mlp

__all__ = ["AestheticReward", "ClipReward", "ClipScoreReward", "HpsV2Reward", "PickScoreReward", "aesthetic_mlp",
           "clip_config_of", "open_clip_to_clip"]

"""Rewards: OCR of the prompt's quoted text (image and video), pixel statistics, weighted combinations.

    from rlrunner.rewards import AsyncRewardScorer, build_reward
    reward = build_reward(cfg.env.train.reward)          # registry lookup on cfg.type / cfg.model
    out = reward(images, prompts)                        # RewardOutput: avg, parts, errors, extra
    with AsyncRewardScorer(reward, num_workers=cfg.env.train.reward.num_workers) as scorer:
        future = scorer.submit(images, prompts)

Registered rewards: ``ocr``, ``video_ocr``, ``image_stats``, ``jpeg_compressibility``, the CLIP family ``pickscore``,
``clipscore``, ``aesthetic``, ``hpsv2`` (``rewards/clip``), and the HTTP clients ``remote`` (a reward server,
``bin/rlrunner serve_reward``; ``rewards/serving``), ``vlm_ocr`` (``rewards/ocr``), the VLM judges ``unifiedreward``, ``unifiedreward2``, ``vlm_yesno`` (``rewards/judges``) and ``geneval``
(``rewards/geneval``, a detector server) (``reward.model``); types ``single`` and ``multi``
(``reward.type``); OCR engines ``rapidocr`` and ``paddleocr`` (``reward.engine``, default ``auto``). They register
when this package imports their modules; rewards of other packages (entry points of group ``rlrunner.rewards``,
docs/families/index.md "A family or a reward from your own package") register after them
(:func:`~rlrunner.rewards.registry.load_reward_plugins`).

May import: rlrunner.config, rlrunner.models, rlrunner.utils
"""

from . import clip, geneval, image_stats, judges, multi, ocr, serving  # noqa: F401  (modules register themselves)
from .frames import chunk_frame_scores, num_chunks
from .image_stats import FrameReward, ImageStatsReward, JpegCompressibilityReward, PixelReward
from .multi import MultiReward
from .ocr import (
    ENGINES,
    OcrEngine,
    OcrReward,
    VideoOcrReward,
    VlmOcrReward,
    build_engine,
    extract_target,
    installed_engines,
    ocr_score,
    register_engine,
)
from .output import RewardOutput
from .registry import (
    REWARD_TYPES,
    REWARDS,
    Reward,
    RewardUnavailable,
    build_reward,
    load_reward_plugins,
    register_reward,
    reward_config,
)
from .scorer import AsyncRewardScorer
from .serving import RemoteReward

load_reward_plugins()  # after the in-tree rewards: a plugin cannot take their names

__all__ = [
    "ENGINES",
    "REWARDS",
    "REWARD_TYPES",
    "AsyncRewardScorer",
    "FrameReward",
    "ImageStatsReward",
    "JpegCompressibilityReward",
    "MultiReward",
    "OcrEngine",
    "OcrReward",
    "PixelReward",
    "RemoteReward",
    "Reward",
    "RewardOutput",
    "RewardUnavailable",
    "VideoOcrReward",
    "VlmOcrReward",
    "build_engine",
    "build_reward",
    "chunk_frame_scores",
    "extract_target",
    "installed_engines",
    "num_chunks",
    "ocr_score",
    "register_engine",
    "register_reward",
    "reward_config",
]

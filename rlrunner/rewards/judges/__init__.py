"""VLM judges (``reward.model``: ``unifiedreward``, ``unifiedreward2``, ``vlm_yesno``) on an OpenAI-compatible
endpoint: prompt templates and reply parsers in ``parsers.py`` (pure), the HTTP side in ``judge.py``."""

from .judge import UnifiedReward2Judge, UnifiedRewardJudge, VlmJudgeReward, YesNoJudge
from .parsers import UnparsableReply, parse_final_score, parse_three_axes, yes_probability

__all__ = [
    "UnifiedReward2Judge",
    "UnifiedRewardJudge",
    "UnparsableReply",
    "VlmJudgeReward",
    "YesNoJudge",
    "parse_final_score",
    "parse_three_axes",
    "yes_probability",
]

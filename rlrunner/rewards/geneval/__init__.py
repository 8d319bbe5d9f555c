"""GenEval (``reward.model: geneval``): the official scoring as pure functions over detections (``scoring.py``) and
the client of a detector service (``reward.py``; the server's environment is in README.md here)."""

from .reward import GenEvalReward
from .scoring import Detection, correct, partial_score, relative_position, select_objects

__all__ = ["Detection", "GenEvalReward", "correct", "partial_score", "relative_position", "select_objects"]

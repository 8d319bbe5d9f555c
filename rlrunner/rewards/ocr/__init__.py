"""OCR rewards (``reward.model``: ``ocr``, ``video_ocr``, ``vlm_ocr``): ``reward.py`` reads the prompt's quoted text
and scores an engine's reading of it (``ocr_score``, pure), ``engines.py`` the local OCR engines (RapidOCR,
PaddleOCR), ``video.py`` the frame-aware reward, ``vlm.py`` a VLM's transcription over an OpenAI-compatible
endpoint, scored like an engine's. A new OCR engine registers in ``engines.py``."""

from . import reward, video, vlm  # noqa: F401  (modules register themselves)
from .engines import ENGINES, OcrEngine, build_engine, installed_engines, register_engine
from .reward import OcrReward, extract_target, ocr_score
from .video import VideoOcrReward
from .vlm import VlmOcrReward

__all__ = ["ENGINES", "OcrEngine", "OcrReward", "VideoOcrReward", "VlmOcrReward", "build_engine", "extract_target",
           "installed_engines", "ocr_score", "register_engine"]

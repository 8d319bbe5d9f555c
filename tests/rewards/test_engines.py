"""Engine selection and the PaddleOCR adapters (PaddleOCR is replaced by a mock: it needs model downloads)."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

import numpy as np
import pytest
from reward_helpers import FakeEngine, coded_image

from rlrunner.rewards import build_reward
from rlrunner.rewards import engines as eng
from rlrunner.rewards.engines import PaddleOcrEngine, build_engine


def fake_paddleocr(version: str, fail: bool = False) -> types.ModuleType:
    """A stand-in ``paddleocr`` module recording constructor kwargs and the arrays it is given."""
    module = types.ModuleType("paddleocr")
    module.__spec__ = importlib.machinery.ModuleSpec("paddleocr", None)
    module.__version__ = version
    seen: dict[str, Any] = {"inputs": []}
    module.seen = seen

    class PaddleOCR:
        def __init__(self, **kwargs: Any) -> None:
            if fail:
                raise RuntimeError("cannot download PP-OCR models (offline)")
            seen["init"] = kwargs

        def _get_ocr_model_names(self, lang: str, version: Any) -> tuple[str, str]:
            return "det_model", f"{lang}_rec_model"

        def predict(self, images: list[np.ndarray]) -> list[dict[str, Any]]:  # 3.x
            seen["inputs"].extend(images)
            return [{"rec_texts": ["Hello", "World"], "rec_scores": [0.99, 0.2]} for _ in images]

        def ocr(self, image: np.ndarray, det: bool = True, rec: bool = True, cls: bool = True) -> list[Any]:  # 2.x
            seen["inputs"].append(image)
            seen["cls"] = cls
            if not det:
                return [[("Hello", 0.98)]]
            if image[0, 0, 2] == 0:  # red channel of a BGR array
                return [None]  # 2.x returns [None] when nothing is found
            return [[[[[0, 0], [1, 0], [1, 1], [0, 1]], ("Hello", 0.99)], [[[0, 2]] * 4, ("World", 0.9)]]]

    class TextRecognition:
        def __init__(self, **kwargs: Any) -> None:
            seen["rec_init"] = kwargs

        def predict(self, images: list[np.ndarray], batch_size: int = 1) -> list[dict[str, Any]]:
            return [{"rec_text": "Hello", "rec_score": 0.97} for _ in images]

    module.PaddleOCR = PaddleOCR
    module.TextRecognition = TextRecognition
    return module


def rgb_image() -> np.ndarray:
    image = coded_image(7, 16)
    image[0, 0] = (10, 20, 30)
    return image


def test_paddleocr_3x_api(monkeypatch) -> None:
    module = fake_paddleocr("3.7.0")
    monkeypatch.setitem(sys.modules, "paddleocr", module)
    engine = PaddleOcrEngine(lang="en", use_gpu=True, num_threads=2, batch_size=4)
    init = module.seen["init"]
    assert init["device"] == "gpu" and init["lang"] == "en" and init["use_textline_orientation"] is False
    assert init["text_det_limit_type"] == "max" and init["text_det_limit_side_len"] == 960
    assert engine.read([rgb_image(), rgb_image()]) == [[("Hello", 0.99), ("World", 0.2)]] * 2
    assert tuple(module.seen["inputs"][0][0, 0]) == (30, 20, 10)  # RGB in, BGR to PaddleOCR
    assert engine.read_lines([rgb_image()]) == [("Hello", 0.97)]
    assert module.seen["rec_init"]["model_name"] == "en_rec_model"


def test_paddleocr_2x_api(monkeypatch) -> None:
    module = fake_paddleocr("2.7.3")
    monkeypatch.setitem(sys.modules, "paddleocr", module)
    engine = PaddleOcrEngine(lang="en", use_gpu=False)
    init = module.seen["init"]
    assert init["use_gpu"] is False and init["use_angle_cls"] is False and init["det_limit_type"] == "max"
    empty = coded_image(0, 16)
    assert engine.read([rgb_image(), empty]) == [[("Hello", 0.99), ("World", 0.9)], []]
    assert module.seen["cls"] is False
    assert engine.read_lines([rgb_image()]) == [("Hello", 0.98)]


def test_paddleocr_reward_end_to_end_with_mock(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "paddleocr", fake_paddleocr("3.0.0"))
    reward = build_reward({"model": "ocr", "engine": "paddleocr"})
    out = reward(np.stack([rgb_image()]), ['"hello world"'])
    assert out.extra["texts"] == ["Hello"]  # "World" dropped: confidence 0.2 < 0.5
    assert out.avg[0] == pytest.approx(1 - 5 / 10)


def test_missing_engines_say_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "paddleocr", None)
    monkeypatch.setitem(sys.modules, "rapidocr", None)
    with pytest.raises(ImportError, match=r"pip install paddleocr.*requirements/gpu\.txt"):
        build_engine("paddleocr")
    with pytest.raises(ImportError, match=r"pip install rapidocr.*requirements/core\.txt"):
        build_engine("rapidocr")
    with pytest.raises(ImportError, match="No OCR engine is usable"):
        build_engine("auto")
    with pytest.raises(ImportError, match="requirements/gpu.txt"):
        build_reward({"model": "ocr", "engine": "paddleocr"})


def test_auto_prefers_paddleocr_and_falls_back(monkeypatch) -> None:
    monkeypatch.setitem(eng.ENGINES, "fake", FakeEngine)
    monkeypatch.setattr(eng, "AUTO_ORDER", (("paddleocr", "paddleocr"), ("fake", "numpy")))
    monkeypatch.setitem(sys.modules, "paddleocr", fake_paddleocr("3.0.0"))
    assert build_engine("auto")[1] == "paddleocr"
    monkeypatch.setitem(sys.modules, "paddleocr", fake_paddleocr("3.0.0", fail=True))
    engine, name = build_engine("auto")
    assert name == "fake" and isinstance(engine, FakeEngine)
    monkeypatch.setitem(sys.modules, "paddleocr", None)
    assert build_engine("auto")[1] == "fake"

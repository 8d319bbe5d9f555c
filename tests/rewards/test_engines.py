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
from rlrunner.rewards.ocr import engines as eng
from rlrunner.rewards.ocr.engines import PaddleOcrEngine, build_engine


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
    """3.x gets the PP-OCRv4 English models by name (alone, PaddleOCR(lang="en") would pick PP-OCRv5), and
    recognition-only reading builds the public TextRecognition with the same recogniser."""
    module = fake_paddleocr("3.7.0")
    monkeypatch.setitem(sys.modules, "paddleocr", module)
    engine = PaddleOcrEngine(lang="en", use_gpu=True, num_threads=2, batch_size=4)
    assert module.seen["init"] == {
        "text_detection_model_name": "PP-OCRv4_mobile_det", "text_recognition_model_name": "en_PP-OCRv4_mobile_rec",
        "device": "gpu", "cpu_threads": 2, "use_doc_orientation_classify": False, "use_doc_unwarping": False,
        "use_textline_orientation": False, "text_det_limit_type": "max", "text_det_limit_side_len": 960,
        "text_rec_score_thresh": 0.0, "text_recognition_batch_size": 4,
    }  # no lang / ocr_version: 3.x ignores them, with a warning, once model names are given
    assert engine.read([rgb_image(), rgb_image()]) == [[("Hello", 0.99), ("World", 0.2)]] * 2
    assert tuple(module.seen["inputs"][0][0, 0]) == (30, 20, 10)  # RGB in, BGR to PaddleOCR
    assert "rec_init" not in module.seen  # built on first recognition-only call
    assert engine.read_lines([rgb_image()]) == [("Hello", 0.97)]
    assert module.seen["rec_init"] == {"model_name": "en_PP-OCRv4_mobile_rec", "device": "gpu", "cpu_threads": 2}


def test_paddleocr_3x_ocr_version_option_and_bad_pairs(monkeypatch) -> None:
    module = fake_paddleocr("3.2.0")
    monkeypatch.setitem(sys.modules, "paddleocr", module)
    PaddleOcrEngine(lang="en", ocr_version="PP-OCRv5").read_lines([rgb_image()])
    assert module.seen["init"]["text_detection_model_name"] == "PP-OCRv5_server_det"
    assert module.seen["init"]["text_recognition_model_name"] == "en_PP-OCRv5_mobile_rec"
    assert module.seen["rec_init"]["model_name"] == "en_PP-OCRv5_mobile_rec"
    with pytest.raises(ValueError, match=r"reward\.ocr_version 'PP-OCRv9' is not one of \['PP-OCRv4', 'PP-OCRv5'\]"):
        PaddleOcrEngine(ocr_version="PP-OCRv9")
    with pytest.raises(ValueError, match=r"reward\.lang 'fr' has no PaddleOCR PP-OCRv4 models.*\['en', 'ch'\]"):
        PaddleOcrEngine(lang="fr")


def test_reward_passes_ocr_version_to_the_engine(monkeypatch) -> None:
    module = fake_paddleocr("3.0.0")
    monkeypatch.setitem(sys.modules, "paddleocr", module)
    build_reward({"model": "ocr", "engine": "paddleocr"})
    assert module.seen["init"]["text_recognition_model_name"] == "en_PP-OCRv4_mobile_rec"  # schema default
    build_reward({"model": "ocr", "engine": "paddleocr", "ocr_version": "PP-OCRv5"})
    assert module.seen["init"]["text_recognition_model_name"] == "en_PP-OCRv5_mobile_rec"


def test_paddleocr_2x_api(monkeypatch) -> None:
    module = fake_paddleocr("2.7.3")
    monkeypatch.setitem(sys.modules, "paddleocr", module)
    engine = PaddleOcrEngine(lang="en", use_gpu=False)
    init = module.seen["init"]
    assert init["use_gpu"] is False and init["use_angle_cls"] is False and init["det_limit_type"] == "max"
    assert init["lang"] == "en" and init["ocr_version"] == "PP-OCRv4"  # 2.x picks PP-OCRv4's models itself
    empty = coded_image(0, 16)
    assert engine.read([rgb_image(), empty]) == [[("Hello", 0.99), ("World", 0.9)], []]
    assert module.seen["cls"] is False
    assert engine.read_lines([rgb_image()]) == [("Hello", 0.98)]
    with pytest.raises(ValueError, match=r"PP-OCRv5.*needs PaddleOCR 3\.x, but 2\.7\.3 is installed"):
        PaddleOcrEngine(ocr_version="PP-OCRv5")


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

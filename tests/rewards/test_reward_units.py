"""Rewards with the OCR engine replaced by fixed strings: registry, batching, errors, video chunks, multi, config."""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf
from reward_helpers import BOOM, coded_image

from rlrunner.rewards import (
    REWARDS,
    RewardOutput,
    build_reward,
    chunk_frame_scores,
    num_chunks,
)
from rlrunner.rewards.image_stats import flat_fraction


def batch(*codes: int, size: int = 32) -> np.ndarray:
    return np.stack([coded_image(c, size, seed=i) for i, c in enumerate(codes)])


PROMPT = 'a sign that says "Hello World"'


def test_scores_from_fixed_strings(fake_engine) -> None:
    reward = build_reward({"model": "ocr", "engine": "fake"})
    out = reward(batch(1, 2, 3, 0, 5), [PROMPT] * 5)
    assert out.avg.dtype == np.float32 and out.avg.shape == (5,)
    # lines joined; one substitution; low-confidence line dropped; nothing read; substring rule
    np.testing.assert_allclose(out.avg, [1.0, 0.9, 0.0, 0.0, 1.0])
    np.testing.assert_array_equal(out.parts["ocr"], out.avg)
    assert out.extra["texts"] == ["HelloWorld", "hallo world", "", "", "xx HELLO WORLD yy"]
    assert out.errors == 0 and out.extra["targets"] == ["Hello World"] * 5


def test_batches_follow_batch_size(fake_engine) -> None:
    reward = build_reward({"model": "ocr", "engine": "fake", "batch_size": 2})
    reward(batch(1, 1, 1, 1, 1), [PROMPT] * 5)
    assert fake_engine.calls == [("read", 2), ("read", 2), ("read", 1)]


def test_rec_only_uses_recognition_only(fake_engine) -> None:
    reward = build_reward({"model": "ocr", "engine": "fake", "rec_only": True})
    out = reward(batch(1, 2), [PROMPT] * 2)
    assert fake_engine.calls == [("read_lines", 2)]
    np.testing.assert_allclose(out.avg, [1.0, 0.9])


def test_alphabet_filters_recognised_text(fake_engine) -> None:
    reward = build_reward({"model": "ocr", "engine": "fake", "alphabet": "helowrd"})
    out = reward(batch(5), ['"hello world"'])
    assert out.extra["texts"] == ["HELLOWORLD"]  # "xx", "yy" and spaces removed, case kept
    reward = build_reward({"model": "ocr", "engine": "fake", "alphabet": "abc"})
    assert reward(batch(1), ['"hello"']).avg[0] == 0.0


def test_bad_inputs_score_zero_and_are_counted(fake_engine, caplog) -> None:
    reward = build_reward({"model": "ocr", "engine": "fake", "batch_size": 4})
    images = batch(1, 1, BOOM, 1, 1).astype(np.float32) / 255.0
    images[1, 3, 3, 1] = np.nan
    images[3] = 0.0  # all black
    prompts = [PROMPT, PROMPT, PROMPT, PROMPT, 'empty target ""']
    with caplog.at_level(logging.WARNING):
        out = reward(images, prompts)
        reward(images, prompts)  # same reasons again: no new warnings
    np.testing.assert_allclose(out.avg, [1.0, 0, 0, 0, 0])
    assert out.errors == 4
    assert out.extra["error_mask"].tolist() == [False, True, True, True, True]
    assert out.extra["error_reasons"] == {
        "non-finite pixels": 1,
        "engine error": 1,
        "blank image": 1,
        "empty target text": 1,
    }
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4
    assert any("simulated engine crash" in w for w in warnings)


def test_engine_crash_is_isolated_to_its_image(fake_engine) -> None:
    reward = build_reward({"model": "ocr", "engine": "fake", "batch_size": 8})
    out = reward(batch(1, BOOM, 2, BOOM), [PROMPT] * 4)
    np.testing.assert_allclose(out.avg, [1.0, 0.0, 0.9, 0.0])
    assert out.errors == 2


def test_tiny_images_are_errors(fake_engine) -> None:
    reward = build_reward({"model": "ocr", "engine": "fake"})
    out = reward(batch(1, 1, size=4), [PROMPT] * 2)
    assert out.errors == 2 and out.avg.tolist() == [0.0, 0.0]
    assert fake_engine.calls == []


def test_caller_bugs_raise(fake_engine) -> None:
    reward = build_reward({"model": "ocr", "engine": "fake"})
    with pytest.raises(ValueError, match="prompts"):
        reward(batch(1, 1), [PROMPT])
    with pytest.raises(ValueError, match=r"\[B, H, W, 3\]"):
        reward(batch(1, 1)[None], [PROMPT])
    with pytest.raises(TypeError, match="dtype"):
        reward(batch(1).astype(np.int64), [PROMPT])


def test_empty_batch(fake_engine) -> None:
    out = build_reward({"model": "ocr", "engine": "fake"})(np.zeros((0, 32, 32, 3), np.uint8), [])
    assert out.avg.shape == (0,) and out.errors == 0


# ----------------------------------------------------------------------------- video


def test_chunking_rule() -> None:
    frames = np.arange(9, dtype=np.float32)[None] / 10  # [1, 9]
    np.testing.assert_allclose(chunk_frame_scores(frames, 4), [[0.0, 0.25, 0.65]])
    np.testing.assert_allclose(chunk_frame_scores(frames, 0), frames)
    np.testing.assert_allclose(chunk_frame_scores(frames, -1), frames)
    np.testing.assert_allclose(chunk_frame_scores(frames[:, :7], 4), [[0.0, 0.25, 0.55]])  # partial last chunk
    assert [num_chunks(f, 4) for f in (1, 5, 9, 81, 7)] == [1, 2, 3, 21, 3]
    assert num_chunks(9, 0) == 9


def test_video_reward_chunks(fake_engine) -> None:
    reward = build_reward({"model": "video_ocr", "engine": "fake", "batch_size": 4})
    codes = [[1, 0, 0, 0, 0, 2, 2, 1, 1], [0] * 9]
    frames = np.stack([batch(*c) for c in codes])  # [2, 9, 32, 32, 3]
    out = reward(frames, [PROMPT, PROMPT])
    assert out.avg.shape == (2, 3) and out.avg.dtype == np.float32
    np.testing.assert_allclose(out.extra["frame_scores"][0], [1, 0, 0, 0, 0, 0.9, 0.9, 1, 1], atol=1e-6)
    np.testing.assert_allclose(out.avg, [[1.0, 0.0, 0.95], [0, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(out.parts["video_ocr"], out.avg.mean(axis=1))
    assert len(out.extra["texts"]) == 2 and len(out.extra["texts"][0]) == 9
    assert sum(n for _, n in fake_engine.calls) == 18  # every frame scored
    raw = build_reward({"model": "video_ocr", "engine": "fake", "frame_interval": 0})(frames, [PROMPT] * 2)
    assert raw.avg.shape == (2, 9)


def test_video_errors_count_frames(fake_engine) -> None:
    reward = build_reward({"model": "video_ocr", "engine": "fake"})
    frames = batch(1, 1, 1, 1, 1)[None].copy()
    frames[0, 2] = 0
    out = reward(frames, [PROMPT])
    assert out.errors == 1 and out.extra["error_mask"].shape == (1, 5)
    np.testing.assert_allclose(out.avg, [[1.0, 0.75]])
    with pytest.raises(ValueError, match="video_ocr expects"):
        reward(frames[0], [PROMPT] * 5)


# ----------------------------------------------------------------------------- image_stats and multi


def test_image_stats_penalises_flat_backgrounds() -> None:
    reward = build_reward({"model": "image_stats"})
    flat = np.full((64, 64, 3), 200, np.uint8)
    text_on_flat = flat.copy()
    text_on_flat[28:36, 8:56] = 0  # a "text" bar: only the 12 patches along its edges have texture
    textured = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    out = reward(np.stack([flat, text_on_flat, textured]), ["x"] * 3)
    assert out.avg[0] == 0.0 and out.avg[2] == 1.0
    assert out.avg[1] == pytest.approx((0.95 - 52 / 64) / (0.95 - 0.5))
    assert out.errors == 0  # a flat image is a bad image, not an error
    assert flat_fraction(flat) == 1.0 and flat_fraction(textured) == 0.0
    video = reward(np.stack([flat, textured] * 3)[None], ["x"])  # [1, 6, 64, 64, 3], frame_interval 4
    np.testing.assert_allclose(video.avg, [[0.0, 0.5, 1.0]])


def test_multi_weighted_mean_and_parts(fake_engine) -> None:
    cfg = {
        "type": "multi",
        "engine": "fake",
        "rewards": [{"model": "ocr", "weight": 1.0}, {"model": "image_stats", "weight": 0.25}],
    }
    reward = build_reward(cfg)
    images = batch(1, 2, 0)
    images[2] = 128  # blank: OCR error, image_stats 0
    out = reward(images, [PROMPT] * 3)
    np.testing.assert_allclose(out.parts["ocr"], [1.0, 0.9, 0.0])
    np.testing.assert_allclose(out.parts["image_stats"], [1.0, 1.0, 0.0])
    np.testing.assert_allclose(out.avg, (np.array([1.0, 0.9, 0.0]) + 0.25 * np.array([1.0, 1.0, 0.0])) / 1.25)
    assert out.errors == 1 and out.extra["error_reasons"] == {"ocr/blank image": 1}
    assert out.extra["ocr/texts"][0] == "HelloWorld"


def test_multi_video_broadcasts_and_repeats(fake_engine) -> None:
    cfg = {
        "type": "multi",
        "engine": "fake",
        "rewards": [{"model": "video_ocr"}, {"model": "image_stats", "weight": 0.0}, {"model": "video_ocr"}],
    }
    reward = build_reward(cfg)
    out = reward(batch(1, 1, 1, 1, 1)[None], [PROMPT])
    assert set(out.parts) == {"video_ocr", "image_stats", "video_ocr_2"}
    np.testing.assert_allclose(out.avg, [[1.0, 1.0]])


def test_multi_config_errors(fake_engine) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        build_reward({"type": "multi"})
    with pytest.raises(ValueError, match="Unknown reward key"):
        build_reward({"type": "multi", "rewards": [{"model": "ocr", "wieght": 2}]})
    with pytest.raises(ValueError, match="'model'"):
        build_reward({"type": "multi", "rewards": [{"weight": 2}]})
    with pytest.raises(ValueError, match="sum to > 0"):
        build_reward({"type": "multi", "rewards": [{"model": "image_stats", "weight": 0}]})
    with pytest.raises(ValueError, match="weight"):
        build_reward({"type": "multi", "rewards": [{"model": "image_stats", "weight": -1}]})


# ----------------------------------------------------------------------------- registry and config


def test_unknown_names_list_the_valid_ones() -> None:
    valid = (r"\['aesthetic', 'clipscore', 'hpsv2', 'image_stats', 'jpeg_compressibility', 'ocr', 'pickscore', "
             r"'remote', 'video_ocr', 'vlm_ocr'\]")
    with pytest.raises(ValueError, match=f"valid names: {valid}"):
        build_reward({"model": "ocrr"})
    with pytest.raises(ValueError, match=r"valid types: \['multi', 'single'\]"):
        build_reward({"type": "mult"})
    with pytest.raises(ValueError, match=r"valid names: \['auto', .*'paddleocr', 'rapidocr'\]"):
        build_reward({"engine": "tesseract"})
    assert {"ocr", "video_ocr", "image_stats"} <= set(REWARDS)


@dataclass
class RewardSchema:  # mirrors the recipe schema's reward section
    type: str = "single"
    model: str = "ocr"
    key: str = "ocr"
    engine: str = "fake"
    use_gpu: bool = False
    lang: str = "en"
    rec_only: bool = False
    frame_interval: int = 4
    batch_size: int = 3
    num_workers: int = 1
    weight: float = 1.0
    alphabet: str = ""
    rewards: list[Any] = field(default_factory=list)


def test_config_forms(fake_engine) -> None:
    struct = OmegaConf.structured(RewardSchema)
    OmegaConf.set_struct(struct, True)
    for cfg in (struct, RewardSchema(), SimpleNamespace(model="ocr", engine="fake", batch_size=3)):
        reward = build_reward(cfg)
        assert reward.spec.batch_size == 3 and reward.engines.engine_name == "fake"
    multi = OmegaConf.structured(RewardSchema(type="multi", rewards=[{"model": "ocr", "key": "ocr"}]))
    assert build_reward(multi).names == ["ocr"]
    with pytest.raises(ValueError, match="batch_size"):
        build_reward({"engine": "fake", "batch_size": 0})


def test_engine_settings_reach_the_engine(fake_engine) -> None:
    reward = build_reward({"engine": "fake", "lang": "fr", "use_gpu": True, "batch_size": 5, "num_workers": 64,
                           "ocr_version": "PP-OCRv5"})
    engine = reward.engines._free[0]
    assert engine.kwargs == {"lang": "fr", "use_gpu": True, "num_threads": 1, "batch_size": 5,
                             "ocr_version": "PP-OCRv5"}


def test_rewards_pickle(fake_engine) -> None:
    reward = build_reward({"type": "multi", "engine": "fake", "rewards": [{"model": "ocr"}, {"model": "image_stats"}]})
    clone = pickle.loads(pickle.dumps(reward))
    out = clone(batch(1), [PROMPT])
    np.testing.assert_allclose(out.parts["ocr"], [1.0])


def test_output_concat() -> None:
    a = RewardOutput(np.ones(2, np.float32), {"ocr": np.ones(2)}, 1, {"texts": ["a", "b"], "error_reasons": {"x": 1}})
    b = RewardOutput(np.zeros(1, np.float32), {"ocr": np.zeros(1)}, 2, {"texts": ["c"], "error_reasons": {"x": 2}})
    out = RewardOutput.concat([a, b])
    assert out.avg.tolist() == [1, 1, 0] and out.errors == 3
    assert out.extra == {"texts": ["a", "b", "c"], "error_reasons": {"x": 3}}


def test_jpeg_compressibility_orders_flat_smooth_and_noisy_images():
    from omegaconf import OmegaConf

    from rlrunner.rewards import build_reward

    reward = build_reward(OmegaConf.create({"model": "jpeg_compressibility"}))
    rng = np.random.default_rng(0)
    flat = np.full((32, 64, 3), 128, np.uint8)
    ramp = np.broadcast_to(np.linspace(0, 255, 64).astype(np.uint8)[None, :, None], (32, 64, 3)).copy()
    noise = rng.integers(0, 256, (32, 64, 3), dtype=np.uint8)
    out = reward(np.stack([flat, ramp, noise]), ["a", "b", "c"])
    assert out.avg[0] == 1.0  # nothing beyond the flat image's bytes
    assert 1.0 > out.avg[1] > out.avg[2] > 0.0
    assert out.parts["jpeg_compressibility"].shape == (3,) and out.errors == 0

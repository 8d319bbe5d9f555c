"""The OCR rewards through the real offline engine on rendered images (skipped only when no engine is installed)."""

from __future__ import annotations

import numpy as np
import pytest
from reward_helpers import render, requires_engine

from rlrunner.rewards import AsyncRewardScorer, build_reward

pytestmark = [pytest.mark.ocr, requires_engine]

TEXTS = ["Hello World", "Open Late", "RL 2025"]
BACKGROUNDS = ["plain", "gradient", "noise"]


def prompt(text: str) -> str:
    return f'a photo of a shop sign that says "{text}", golden hour'


def test_exact_text_scores_high_on_varied_backgrounds(ocr_reward) -> None:
    cases = [(t, bg) for t in TEXTS for bg in BACKGROUNDS][::2] + [("Quick Brown Fox", "noise")]
    images = np.stack([render(t, background=bg, seed=i) for i, (t, bg) in enumerate(cases)])
    out = ocr_reward(images, [prompt(t) for t, _ in cases])
    assert out.errors == 0
    assert (out.avg >= 0.95).all(), list(zip(cases, out.avg, out.extra["texts"]))


def test_wrong_text_scores_low(ocr_reward) -> None:
    images = np.stack([render("Hello World"), render("Open Late", background="gradient")])
    out = ocr_reward(images, [prompt("Zebra Quartz"), prompt("Midnight Bakery")])
    assert (out.avg < 0.35).all(), out.extra["texts"]


def test_blank_and_textless_images_score_zero(ocr_reward) -> None:
    blank = np.full((2, 128, 128, 3), (255, 255, 255), np.uint8)
    blank[1] = 0
    textless = np.clip(np.random.default_rng(0).normal(128, 30, (1, 128, 128, 3)), 0, 255).astype(np.uint8)
    out = ocr_reward(np.concatenate([blank, textless]), [prompt("Hello")] * 3)
    assert out.avg.tolist() == [0.0, 0.0, 0.0]
    assert out.errors == 2  # the blank ones; the textless noise image is scored (and reads nothing)


def test_substring_rule(ocr_reward) -> None:
    out = ocr_reward(render("Hello World")[None], [prompt("World")])
    assert out.avg[0] == 1.0


def test_unicode_text(ocr_reward) -> None:
    words = ["café crème", "Größe 42"]
    out = ocr_reward(np.stack([render(w, font_size=40) for w in words]), [prompt(w) for w in words])
    assert (out.avg >= 0.95).all(), out.extra["texts"]


def test_multi_line_text_is_joined(ocr_reward) -> None:
    image = render("Hello", size=(256, 256))
    image[150:] = render("World", size=(256, 256))[100:206]
    out = ocr_reward(image[None], [prompt("Hello World")])
    assert out.avg[0] >= 0.95, out.extra["texts"]


def test_error_counting_with_real_engine(ocr_reward) -> None:
    good = render("Open Late").astype(np.float32) / 255
    nan = good.copy()
    nan[10, 10] = np.nan
    images = np.stack([good, nan, np.zeros_like(good), np.full_like(good, np.inf)])
    out = ocr_reward(images, [prompt("Open Late")] * 4)
    assert out.avg[0] >= 0.95 and out.avg[1:].tolist() == [0, 0, 0]
    assert out.errors == 3
    tiny = ocr_reward(np.full((1, 4, 4, 3), 90, np.uint8), [prompt("x")])
    assert tiny.errors == 1 and tiny.avg[0] == 0


def test_rec_only_on_single_line_images() -> None:
    words = ["HELLO", "World 42", "zebra"]
    images = np.stack([render(w, size=(128, 32), font_size=20, seed=i) for i, w in enumerate(words)])
    reward = build_reward({"model": "ocr", "rec_only": True})
    out = reward(images, [prompt(w) for w in words])
    assert (out.avg >= 0.95).all(), out.extra["texts"]


def test_batched_engine_matches_per_image_and_keeps_flags(ocr_reward) -> None:
    engine = ocr_reward.engines._free[0]
    images = [render(t, background=bg) for t, bg in zip(TEXTS, BACKGROUNDS)]
    batched = engine.read(images)
    engine.read_lines([render("HELLO", size=(128, 32), font_size=20)])  # a recognition-only call in between...
    single = [engine.read([image])[0] for image in images]  # ...must not leave the engine without a detector
    assert [[t for t, _ in lines] for lines in batched] == [[t for t, _ in lines] for lines in single]
    assert all(lines for lines in single)


def test_video_chunks_on_a_synthetic_clip() -> None:
    text, empty = render("Hello", size=(128, 128), font_size=32), render("", size=(128, 128), background="noise")
    has_text = [True, False, False, False, False, True, True, True, True]
    clip = np.stack([text if t else empty for t in has_text])[None]  # [1, 9, 128, 128, 3]
    reward = build_reward({"model": "video_ocr", "frame_interval": 4, "batch_size": 9})
    out = reward(clip, ['a video of a neon sign "Hello"'])
    assert out.avg.shape == (1, 3) and out.extra["frame_scores"].shape == (1, 9)
    np.testing.assert_allclose(out.extra["frame_scores"][0], np.array(has_text, dtype=float), atol=0.05)
    np.testing.assert_allclose(out.avg[0], [1.0, 0.0, 1.0], atol=0.05)
    assert out.errors == 0


def test_multi_reward_separates_hacked_backgrounds() -> None:
    cfg = {"type": "multi", "rewards": [{"model": "ocr", "weight": 1.0}, {"model": "image_stats", "weight": 0.5}]}
    reward = build_reward(cfg)
    images = np.stack([render("Open Late", background="plain"), render("Open Late", background="noise")])
    out = reward(images, [prompt("Open Late")] * 2)
    assert (out.parts["ocr"] >= 0.95).all()
    assert out.parts["image_stats"][0] < 0.2 and out.parts["image_stats"][1] == 1.0
    np.testing.assert_allclose(out.avg, (out.parts["ocr"] + 0.5 * out.parts["image_stats"]) / 1.5, rtol=1e-6)


def test_async_scorer_with_real_engine(ocr_reward) -> None:
    images = np.stack([render(t, size=(160, 160)) for t in TEXTS])
    prompts = [prompt(t) for t in TEXTS]
    expected = ocr_reward(images, prompts)
    with AsyncRewardScorer(ocr_reward, num_workers=2) as scorer:
        futures = [scorer.submit(images, prompts), scorer.submit(images[::-1], prompts[::-1])]
        first, second = (f.result(timeout=60) for f in futures)
    np.testing.assert_allclose(first.avg, expected.avg)
    np.testing.assert_allclose(second.avg, expected.avg[::-1])
    assert first.extra["texts"] == expected.extra["texts"]

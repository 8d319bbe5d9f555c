"""Helpers for the reward tests: rendered text images, coded noise images and a fake OCR engine."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from rlrunner.rewards import installed_engines
from rlrunner.rewards.ocr.engines import Line, OcrEngine

FONT_CANDIDATES = (
    "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Bold.ttf",
    "/System/Library/Fonts/Supplemental/Arial Bold.ttf",
    "C:/Windows/Fonts/arialbd.ttf",
)

requires_engine = pytest.mark.skipif(
    not installed_engines(),
    reason="no OCR engine installed (pip install -r requirements/core.txt adds rapidocr)",
)


@functools.cache
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """A system TrueType font if one exists, else Pillow's built-in scalable default font."""
    for path in FONT_CANDIDATES:
        if Path(path).exists():
            return ImageFont.truetype(path, size)
    return ImageFont.load_default(size=size)


def render(
    text: str,
    size: tuple[int, int] = (256, 256),
    font_size: int = 36,
    background: str = "plain",
    color: tuple[int, int, int] = (20, 20, 30),
    seed: int = 0,
) -> np.ndarray:
    """uint8 ``[H, W, 3]`` image (``size`` is (W, H)) with ``text`` centred on a plain, gradient or noisy background."""
    w, h = size
    rng = np.random.default_rng(seed)
    if background == "plain":
        base = np.full((h, w, 3), (235, 228, 205), dtype=np.uint8)
    elif background == "gradient":
        ramp = np.linspace(150, 255, w, dtype=np.float32)[None, :, None]
        base = np.broadcast_to(ramp * np.array([1.0, 0.9, 0.7], dtype=np.float32), (h, w, 3)).astype(np.uint8)
    elif background == "noise":
        base = np.clip(rng.normal(200, 25, (h, w, 3)), 0, 255).astype(np.uint8)
    else:
        raise ValueError(background)
    image = Image.fromarray(np.ascontiguousarray(base))
    draw = ImageDraw.Draw(image)
    while True:  # shrink the font until the text fits in 90 % of the width
        f = font(font_size)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=f)
        if right - left <= 0.9 * w or font_size <= 8:
            break
        font_size -= 2
    draw.text(((w - (right - left)) / 2 - left, (h - (bottom - top)) / 2 - top), text, font=f, fill=color)
    return np.array(image)


#: top-left red value -> lines the fake engine "recognises"; value 13 makes the engine raise.
TEXTS: dict[int, list[Line]] = {
    0: [],
    1: [("Hello", 0.99), ("World", 0.97)],
    2: [("hallo world", 0.9)],
    3: [("Hello World", 0.3)],  # below the confidence threshold: dropped
    4: [("Größe", 0.95)],
    5: [("xx HELLO WORLD yy", 0.9)],
}
BOOM = 13


def coded_image(code: int, size: int = 32, seed: int = 0) -> np.ndarray:
    """uint8 ``[size, size, 3]`` noise image whose top-left red value is ``code`` (so it is never blank)."""
    image = np.random.default_rng(seed).integers(40, 200, (size, size, 3), dtype=np.uint8)
    image[0, 0, 0] = code
    return image


class FakeEngine(OcrEngine):
    """Reads the code pixel; records the size of every call in ``FakeEngine.calls``."""

    name = "fake"
    calls: ClassVar[list[tuple[str, int]]] = []

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs

    def _lines(self, image: np.ndarray) -> list[Line]:
        code = int(image[0, 0, 0])
        if code == BOOM:
            raise RuntimeError("simulated engine crash")
        return TEXTS.get(code, [])

    def read(self, images: list[np.ndarray]) -> list[list[Line]]:
        FakeEngine.calls.append(("read", len(images)))
        return [self._lines(image) for image in images]

    def read_lines(self, images: list[np.ndarray]) -> list[Line]:
        FakeEngine.calls.append(("read_lines", len(images)))
        return [(" ".join(t for t, _ in self._lines(image)), 0.9) for image in images]

"""``image_stats``: a cheap pixel-statistics reward against OCR reward hacking, and the template for new rewards.

The OCR reward alone is maximised by crisp text on an empty background. This reward is 1 for images whose
background has texture and falls to 0 as the image becomes flat: it splits a (downsampled) luma image into
8×8 patches and measures the fraction of near-constant patches. Use it as a part of ``type: multi``::

    reward:
      type: multi
      rewards:
        - {model: ocr, weight: 1.0}
        - {model: image_stats, weight: 0.2}

Adding a reward (see also ``rlrunner/rewards/README.md``):

1. Subclass ``Reward`` in a new module of this package, set ``name``, and implement
   ``__call__(images, prompts) -> RewardOutput`` (``avg`` float32 ``[B]``; ``parts = {name: avg}``).
   Convert and check inputs with ``as_uint8``; give unscorable images 0 and report them through ``errors`` /
   ``extra["error_mask"]`` / ``warn_once`` instead of raising. Keep the instance thread-safe and picklable.
2. Decorate the class with ``@register_reward("<name>")`` and import the module in ``rewards/__init__.py``.
3. Add tests under ``tests/rewards/``. It is now usable as ``reward.model: <name>`` or as a ``multi`` part.
"""

from __future__ import annotations

import io
from abc import abstractmethod

import numpy as np
from PIL import Image

from rlrunner.config.schema import RewardConfig

from .frames import chunk_frame_scores
from .inputs import all_failed, as_uint8, check_prompts, error_summary, reason_key
from .output import RewardOutput
from .registry import Reward, register_reward

_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def flat_fraction(image: np.ndarray, patch: int = 8, flat_std: float = 3.0, max_side: int = 256) -> float:
    """Fraction of ``patch``×``patch`` luma patches whose standard deviation is below ``flat_std`` (uint8 units).

    ``image`` is uint8 ``[H, W, 3]``; it is first block-averaged so its longer side is at most ~``max_side``.
    """
    luma = image.astype(np.float32) @ _LUMA
    step = max(1, max(luma.shape) // max_side)
    if step > 1:
        h, w = (luma.shape[0] // step) * step, (luma.shape[1] // step) * step
        luma = luma[:h, :w].reshape(h // step, step, w // step, step).mean(axis=(1, 3))
    h, w = (luma.shape[0] // patch) * patch, (luma.shape[1] // patch) * patch
    if h == 0 or w == 0:
        return float(luma.std() < flat_std)
    patches = luma[:h, :w].reshape(h // patch, patch, w // patch, patch)
    return float((patches.std(axis=(1, 3)) < flat_std).mean())


class FrameReward(Reward):
    """A reward that scores every image (every video frame) on its own: subclasses implement :meth:`score_batch`.

    Accepts images ``[B, H, W, 3]`` (``avg`` ``[B]``) or frames ``[B, F, H, W, 3]`` (``avg`` ``[B, K]``, chunked
    like ``video_ocr`` with ``frame_interval``). ``parts[name]`` is ``[B]`` (mean over chunks for video).
    Unscorable images get 0 and are counted, as for every reward.
    """

    @abstractmethod
    def score_batch(self, images: np.ndarray, prompts: list[str], reasons: list[str | None]) -> np.ndarray:
        """Scores float32 ``[N]`` of uint8 ``images`` ``[N, H, W, 3]`` (video frames flattened) with each one's
        prompt; an image with a reason (not None) must score 0."""

    def __call__(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        images = np.asarray(images)
        video = images.ndim == 5
        frames = images.shape[1] if video else 1
        flat, reasons = as_uint8(images, frame_axes=int(video))
        prompts = check_prompts(prompts, flat.shape[0] // frames)
        scores = self.score_batch(flat, [p for p in prompts for _ in range(frames)], reasons)
        for r in reasons:
            if r is not None:
                self.warn_once(reason_key(r), r)
        mask, counts = error_summary(reasons)
        if video:
            scores = scores.reshape(-1, frames)
            avg = chunk_frame_scores(scores, self.spec.frame_interval)
            part = avg.mean(axis=1).astype(np.float32)
            mask = mask.reshape(-1, frames)
        else:
            avg, part = scores, scores.copy()
        extra = {"error_mask": mask, "error_reasons": counts, "image_errors": reasons}
        if video:
            extra["frame_scores"] = scores
        return RewardOutput(avg=avg, parts={self.name: part}, errors=int(mask.sum()), extra=extra,
                            failure=all_failed(reasons))


class PixelReward(FrameReward):
    """A reward computed from each image's pixels alone: subclasses implement :meth:`score`."""

    @abstractmethod
    def score(self, image: np.ndarray) -> float:
        """Score one uint8 image ``[H, W, 3]``."""

    def score_batch(self, images: np.ndarray, prompts: list[str], reasons: list[str | None]) -> np.ndarray:
        return np.array([0.0 if r else self.score(im) for im, r in zip(images, reasons)], dtype=np.float32)


@register_reward("image_stats")
class ImageStatsReward(PixelReward):
    """Background-texture reward: ``clip((max_flat − flat_fraction) / (max_flat − min_flat), 0, 1)``.

    Images with at most ``min_flat`` of their patches flat score 1, images with ``max_flat`` or more score 0.
    """

    def __init__(self, spec: RewardConfig, min_flat: float = 0.5, max_flat: float = 0.95, flat_std: float = 3.0) -> None:
        super().__init__(spec)
        if not 0.0 <= min_flat < max_flat <= 1.0:
            raise ValueError(f"image_stats needs 0 <= min_flat < max_flat <= 1, got {min_flat}, {max_flat}")
        self.min_flat, self.max_flat, self.flat_std = min_flat, max_flat, flat_std

    def score(self, image: np.ndarray) -> float:
        flat = flat_fraction(image, flat_std=self.flat_std)
        return float(np.clip((self.max_flat - flat) / (self.max_flat - self.min_flat), 0.0, 1.0))


@register_reward("jpeg_compressibility")
class JpegCompressibilityReward(PixelReward):
    """DDPO's sanity reward (Black et al., 2023): images that JPEG-compress well score high.

    ``score = 1 / (1 + extra_bits_per_pixel / bits_scale)`` in (0, 1], where the extra bits are the JPEG size
    (quality 95) beyond that of a flat image of the same size, so headers do not count. It never saturates, needs
    no model and differs between samples even for pure noise, so it checks that a new setup learns before an
    expensive reward is plugged in.
    """

    def __init__(self, spec: RewardConfig, bits_scale: float = 4.0, quality: int = 95) -> None:
        super().__init__(spec)
        self.bits_scale, self.quality = bits_scale, quality

    def _jpeg_bytes(self, image: np.ndarray) -> int:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=self.quality)
        return buffer.tell()

    def score(self, image: np.ndarray) -> float:
        flat = self._jpeg_bytes(np.full_like(image, 128))
        extra_bits_per_pixel = 8 * (self._jpeg_bytes(image) - flat) / (image.shape[0] * image.shape[1])
        return 1.0 / (1.0 + max(extra_bits_per_pixel, 0.0) / self.bits_scale)

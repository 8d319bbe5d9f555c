"""Checks of a reward's inputs at the boundary, and the bookkeeping of images that cannot be scored.

Bad inputs never raise inside a reward's ``__call__``: an image that cannot be scored gets 0, is counted in
``RewardOutput.errors`` and its reason is logged once per reward instance. Only a caller bug (a batch of the
wrong rank or dtype, prompts that do not match the batch) raises.
"""

from __future__ import annotations

import numpy as np

#: Images whose shorter side is below this many pixels are not scored (reward 0, counted as an error).
MIN_SIDE = 8
#: Images whose pixel values all lie within this range (max − min, uint8 units) are "blank".
BLANK_RANGE = 2


def as_uint8(images: np.ndarray, frame_axes: int) -> tuple[np.ndarray, list[str | None]]:
    """Check a batch at the boundary and convert it to uint8.

    Args:
        images: ``[B, H, W, 3]`` (``frame_axes=0``) or ``[B, F, H, W, 3]`` (``frame_axes=1``); uint8, or float
            in [0, 1] (diffusers' ``output_type="np"``). 1 (gray) or 4 (RGBA) channels are accepted too.
        frame_axes: number of axes between batch and pixels.

    Returns:
        ``(uint8 [N, H, W, 3] with N = B·F, reasons)``: ``reasons[i]`` is why image ``i`` cannot be scored
        (non-finite pixels, too small), or None. Non-finite pixels become 0 in the returned array.

    Raises:
        ValueError/TypeError for a batch of the wrong rank or dtype (a caller bug, not bad data).
    """
    images = np.asarray(images)
    rank = 4 + frame_axes
    if images.ndim != rank or images.shape[-1] not in (1, 3, 4):
        layout = "[B, H, W, 3]" if frame_axes == 0 else "[B, F, H, W, 3]"
        raise ValueError(f"Expected images shaped {layout}, got shape {images.shape}")
    flat = images.reshape((-1,) + images.shape[-3:])
    reasons: list[str | None] = [None] * flat.shape[0]
    if np.issubdtype(flat.dtype, np.floating):
        finite = np.isfinite(flat).reshape(flat.shape[0], -1).all(axis=1)
        for i in np.flatnonzero(~finite):
            reasons[i] = "non-finite pixels (NaN/inf)"
        flat = np.nan_to_num(flat, nan=0.0, posinf=1.0, neginf=0.0)
        flat = np.clip(np.rint(flat * 255.0), 0, 255).astype(np.uint8)
    elif flat.dtype != np.uint8:
        raise TypeError(f"Expected uint8 or float images, got dtype {flat.dtype}")
    if flat.shape[-1] == 1:
        flat = np.repeat(flat, 3, axis=-1)
    elif flat.shape[-1] == 4:
        flat = np.ascontiguousarray(flat[..., :3])
    if min(flat.shape[1:3]) < MIN_SIDE:
        reasons = [r or f"image smaller than {MIN_SIDE} px ({flat.shape[1]}x{flat.shape[2]})" for r in reasons]
    return flat, reasons


def is_blank(image: np.ndarray) -> bool:
    """True when all pixels of ``image`` (uint8 ``[H, W, 3]``) lie within ``BLANK_RANGE`` of each other."""
    return int(image.max()) - int(image.min()) <= BLANK_RANGE


def check_prompts(prompts: list[str], batch: int) -> list[str]:
    """Validate the prompt list against the batch size; returns it as a list of str."""
    prompts = list(prompts)
    if len(prompts) != batch:
        raise ValueError(f"Got {batch} images but {len(prompts)} prompts")
    bad = [type(p).__name__ for p in prompts if not isinstance(p, str)]
    if bad:
        raise TypeError(f"Prompts must be str, got {bad[:3]}")
    return prompts


def error_summary(reasons: list[str | None]) -> tuple[np.ndarray, dict[str, int]]:
    """``(bool mask [N], reason -> count)`` from per-image reasons (None = no error)."""
    mask = np.array([r is not None for r in reasons], dtype=bool)
    counts: dict[str, int] = {}
    for r in reasons:
        if r is not None:
            key = reason_key(r)
            counts[key] = counts.get(key, 0) + 1
    return mask, counts


def all_failed(reasons: list[str | None]) -> str:
    """``RewardOutput.failure`` for per-image ``reasons``: empty unless every image has one."""
    if not reasons or any(r is None for r in reasons):
        return ""
    return f"all {len(reasons)} images were unscorable; the last one: {reasons[-1]}"


def reason_key(reason: str) -> str:
    """The short key of a reason: text before the first ' (' or ':' (details vary, keys do not)."""
    return reason.split(" (")[0].split(":")[0]

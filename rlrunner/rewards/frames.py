"""Video rewards score every frame, then group frames into chunks that match the latent frames of a 4× temporal
VAE (Wan 2.x): with ``frame_interval = k`` the chunk rewards are ``[frame0, mean(frames 1..k), ...]``."""

from __future__ import annotations

import math

import numpy as np


def num_chunks(num_frames: int, frame_interval: int) -> int:
    """K, the number of chunk rewards for ``num_frames`` frames (= latent frames for ``F = 4n + 1``, k = 4)."""
    if frame_interval <= 0 or num_frames <= 1:
        return num_frames
    return 1 + math.ceil((num_frames - 1) / frame_interval)


def chunk_frame_scores(frame_scores: np.ndarray, frame_interval: int) -> np.ndarray:
    """Per-frame scores ``[B, F]`` -> chunk scores ``[B, K]`` (``K = num_chunks(F, frame_interval)``), float32."""
    frame_scores = np.asarray(frame_scores, dtype=np.float32)
    num_frames = frame_scores.shape[1]
    if frame_interval <= 0 or num_frames <= 1:
        return frame_scores.copy()
    chunks = [frame_scores[:, :1]]
    for start in range(1, num_frames, frame_interval):
        chunks.append(frame_scores[:, start : start + frame_interval].mean(axis=1, keepdims=True))
    return np.concatenate(chunks, axis=1)

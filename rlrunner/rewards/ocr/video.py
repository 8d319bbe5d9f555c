"""Frame-aware OCR reward for video: every decoded frame is scored, then frames are grouped into chunks that
match the latent frames of a 4× temporal VAE (Wan 2.x): with ``frame_interval = k`` the chunk rewards are
``[frame0, mean(frames 1..k), mean(frames k+1..2k), ...]`` (a last partial group is averaged over the frames it
has); ``frame_interval <= 0`` keeps one reward per frame.
"""

from __future__ import annotations

import numpy as np

from ..frames import chunk_frame_scores
from ..inputs import all_failed, as_uint8, check_prompts, error_summary
from ..output import RewardOutput
from ..registry import register_reward
from .reward import OcrReward, extract_target


@register_reward("video_ocr")
class VideoOcrReward(OcrReward):
    """OCR reward for videos.

    Call with frames ``[B, F, H, W, 3]`` (uint8, or float in [0, 1]) and ``B`` prompts. Returns ``avg`` float32
    ``[B, K]`` chunk rewards, ``parts["video_ocr"]`` ``[B]`` (mean over chunks, the ``env/avg`` quantity),
    ``extra["frame_scores"]`` ``[B, F]``, ``extra["texts"]`` (``B`` lists of ``F`` strings),
    ``extra["error_mask"]`` bool ``[B, F]``; ``errors`` counts frames. All ``B·F`` frames go through the engine
    in batches of ``batch_size``.
    """

    def __call__(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        images = np.asarray(images)
        if images.ndim != 5:
            raise ValueError(
                f"video_ocr expects frames [B, F, H, W, 3], got shape {images.shape}; use 'ocr' for images"
            )
        batch, num_frames = images.shape[:2]
        prompts = check_prompts(prompts, batch)
        flat, reasons = as_uint8(images, frame_axes=1)
        frame_prompts = [p for p in prompts for _ in range(num_frames)]
        scores, texts, reasons = self.score_images(flat, frame_prompts, reasons)
        frame_scores = scores.reshape(batch, num_frames)
        chunks = chunk_frame_scores(frame_scores, self.spec.frame_interval)
        mask, counts = error_summary(reasons)
        return RewardOutput(
            avg=chunks,
            parts={self.name: chunks.mean(axis=1).astype(np.float32)},
            errors=int(mask.sum()),
            extra={
                "frame_scores": frame_scores,
                "texts": [texts[b * num_frames : (b + 1) * num_frames] for b in range(batch)],
                "targets": [extract_target(p) for p in prompts],
                "error_mask": mask.reshape(batch, num_frames),
                "error_reasons": counts,
            },
            failure=all_failed(reasons),
        )

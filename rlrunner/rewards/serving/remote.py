"""``reward.model: remote``: images scored by a reward server (``python -m rlrunner.commands.serve_reward``) over HTTP.

    reward:
      model: remote
      url: http://127.0.0.1:8000      # the server's address; its /score and /health are used
      token_file: ""                  # file holding the bearer token (needed when the server has one)
      timeout_s: 60                   # per attempt
      max_retries: 3                  # transient failures only, exponential backoff with jitter
      max_concurrency: 4              # requests in flight; each carries up to batch_size images (whole videos)
      required: true                  # false: failed samples score 0 and are counted, training goes on

The server's reward decides the scores (same engine, same scores as the local reward). Videos travel as lists
of frames, whole when the server takes them in one request; the frame scores are chunked here with
``frame_interval``. Request sizes follow the server's limits, read once from its ``GET /health`` (``limits``:
``max_images``, ``max_request_pixels``, ``max_request_bytes``): a video with more frames than one request may carry
is split into consecutive pieces (the server scores each frame on its own, so the scores are the same), and images
are sent at most as many per request as those limits allow.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlrunner.config.schema import RewardConfig

from ..registry import register_reward
from .client import FrameResults, ServiceError, ServiceReward
from .wire import MalformedMessage, encode_image, encoded_size_bound, parse_score_response


@register_reward("remote")
class RemoteReward(ServiceReward):
    """Client of a reward server; ``avg`` ``[B]`` for images, ``[B, K]`` chunk rewards for frames ``[B, F, ...]``."""

    address_hint = "e.g. http://127.0.0.1:8000 (start the server with: bin/rlrunner serve_reward --reward ocr)"

    def __init__(self, spec: RewardConfig) -> None:
        self.limits: dict[str, Any] | None = None  # the server's, read from /health when first needed
        super().__init__(spec)

    def score_frames(self, frames: np.ndarray, prompts: list[str], reasons: list[str | None],
                     metadata: list[dict[str, Any]]) -> FrameResults:
        batch, num_frames = frames.shape[:2]
        requests = self._plan(batch, num_frames, self._frames_per_request(frames.shape[2], frames.shape[3]))
        answers = self.client.map(lambda pieces: self._score(frames, prompts, pieces), requests)
        result = FrameResults(np.zeros(batch * num_frames, dtype=np.float32), list(reasons),
                              [False] * (batch * num_frames))
        for pieces, answer in zip(requests, answers):
            for j, (b, frame_range) in enumerate(pieces):
                for k, f in enumerate(frame_range):
                    i = b * num_frames + f
                    if result.reasons[i] is not None:  # known here (e.g. NaN pixels): 0, as the local reward
                        continue
                    if isinstance(answer, ServiceError):
                        result.reasons[i], result.unreachable[i] = self.unreachable_reason(answer), True
                    else:
                        result.scores[i], result.reasons[i] = answer[j][k]
        return result

    def _plan(self, batch: int, num_frames: int, cap: int) -> list[list[tuple[int, range]]]:
        """Requests as lists of ``(sample, frame range)`` pieces: whole samples, ``batch_size // num_frames`` (at
        least 1) per request when a sample fits in ``cap`` frames; else each sample in pieces of ``cap`` frames."""
        if num_frames > cap:
            return [[(b, range(start, min(num_frames, start + cap)))]
                    for b in range(batch) for start in range(0, num_frames, cap)]
        per_request = max(1, min(self.spec.batch_size, cap) // num_frames)
        return [[(b, range(num_frames)) for b in range(start, min(batch, start + per_request))]
                for start in range(0, batch, per_request)]

    def _frames_per_request(self, height: int, width: int) -> int:
        """The most images (frames) of ``height`` x ``width`` one request may carry under the server's limits:
        images, pixels, and body bytes (each image at the most its PNG can take; a tenth kept for the rest)."""
        limits = self._server_limits()
        caps = [limits.get("max_images"), (limits.get("max_request_pixels") or 0) // (height * width),
                int(0.9 * (limits.get("max_request_bytes") or 0)) // encoded_size_bound(height, width)]
        return max(1, min([c for c in caps if isinstance(c, int) and c > 0], default=2**31))

    def _server_limits(self) -> dict[str, Any]:
        """The ``limits`` of the server's ``GET /health``, asked once; {} when it states none or cannot be asked
        (the requests then go as planned and the server's 413, if any, says why)."""
        if self.limits is None:
            try:
                body = self.client.request("GET", f"{self.address}/health")
            except ServiceError:
                return {}  # not kept: the next batch asks again
            limits = body.get("limits") if isinstance(body, dict) else None
            self.limits = limits if isinstance(limits, dict) else {}
        return self.limits

    def _score(self, frames: np.ndarray, prompts: list[str],
               pieces: list[tuple[int, range]]) -> list[list[tuple[float, str | None]]]:
        """POST one request with the frames ``pieces``; runs on the client's request threads."""
        video = frames.shape[1] > 1
        images = [[encode_image(frames[b, f]) for f in fs] if video else encode_image(frames[b, 0]) for b, fs in pieces]
        body = self.client.request("POST", f"{self.address}/score", {"prompts": [prompts[b] for b, _ in pieces],
                                                                  "images": images})
        try:
            return parse_score_response(body, [len(fs) if video else None for _, fs in pieces])
        except MalformedMessage as err:
            raise ServiceError(f"{self.address}/score answered malformed JSON: {err}") from None

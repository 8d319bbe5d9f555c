"""``reward.model: remote``: images scored by a reward server (``python -m rlrunner.serve_reward``) over HTTP.

    reward:
      model: remote
      url: http://127.0.0.1:8000      # the server's address; its /score and /health are used
      token_file: ""                  # file holding the bearer token (needed when the server has one)
      timeout_s: 60                   # per attempt
      max_retries: 3                  # transient failures only, exponential backoff with jitter
      max_concurrency: 4              # requests in flight; each carries up to batch_size images (whole videos)
      required: true                  # false: failed samples score 0 and are counted, training goes on

The server's reward decides the scores (same engine, same scores as the local reward). Videos travel as lists
of frames, never split between requests; the frame scores are chunked here with ``frame_interval``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlrunner.config.schema import RewardConfig

from ..registry import register_reward
from .client import FrameResults, ServiceError, ServiceReward, read_secret
from .wire import MalformedMessage, encode_image, parse_score_response


@register_reward("remote")
class RemoteReward(ServiceReward):
    """Client of a reward server; ``avg`` ``[B]`` for images, ``[B, K]`` chunk rewards for frames ``[B, F, ...]``."""

    name = "remote"

    def __init__(self, spec: RewardConfig) -> None:
        if not spec.url:
            raise ValueError("reward.model=remote needs reward.url, e.g. http://127.0.0.1:8000 (start the server "
                             "with: bin/rlrunner serve_reward --reward ocr)")
        super().__init__(spec, read_secret(spec.token_file, "reward.token_file"))
        self.url = spec.url.rstrip("/")
        self.check_reachable(f"{self.url}/health")

    def score_frames(self, frames: np.ndarray, prompts: list[str], reasons: list[str | None],
                     metadata: list[dict[str, Any]]) -> FrameResults:
        batch, num_frames = frames.shape[:2]
        per_request = max(1, self.spec.batch_size // num_frames)
        groups = [range(start, min(batch, start + per_request)) for start in range(0, batch, per_request)]
        answers = self.client.map(lambda group: self._score(frames, prompts, group), groups)
        result = FrameResults(np.zeros(batch * num_frames, dtype=np.float32), list(reasons),
                              [False] * (batch * num_frames))
        for group, answer in zip(groups, answers):
            for j, b in enumerate(group):
                for f in range(num_frames):
                    i = b * num_frames + f
                    if result.reasons[i] is not None:  # known here (e.g. NaN pixels): 0, as the local reward
                        continue
                    if isinstance(answer, ServiceError):
                        result.reasons[i], result.unreachable[i] = self.unreachable_reason(answer), True
                    else:
                        result.scores[i], result.reasons[i] = answer[j][f]
        return result

    def _score(self, frames: np.ndarray, prompts: list[str], group: range) -> list[list[tuple[float, str | None]]]:
        """POST one request with the samples ``group``; runs on the client's request threads."""
        video = frames.shape[1] > 1
        images = [[encode_image(f) for f in frames[b]] if video else encode_image(frames[b, 0]) for b in group]
        body = self.client.request("POST", f"{self.url}/score", {"prompts": [prompts[b] for b in group],
                                                                  "images": images})
        try:
            return parse_score_response(body, len(group), frames.shape[1])
        except MalformedMessage as err:
            raise ServiceError(f"{self.url}/score answered malformed JSON: {err}") from None

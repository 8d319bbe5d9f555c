"""``reward.model: geneval``: a detector service finds the objects, :mod:`.scoring` scores them against each prompt's
GenEval record (``tag``, ``include``, ``exclude`` from a ``.jsonl`` prompt file).

    reward: {model: geneval, url: http://127.0.0.1:18085}     # the detector server (README.md here)

``POST {url}/detect``::

    request   {"images": [<base64 PNG>] * N}
    response  {"detections": [[{"label": str, "box": [x0, y0, x1, y1], "score": float, "color": str | null}] * n] * N}

``avg`` is the partial credit the anchors train on; ``extra["accuracy"]`` GenEval's strict accuracy per image and
``extra["tags"]`` its tag, from which :meth:`RewardOutput.metrics` makes the per-tag accuracies the runner logs
(``eval/geneval/<tag>``, ``eval/geneval/accuracy``). A prompt without a GenEval record, or an answer that is not of this shape, scores 0 and
is counted in ``env/reward_errors``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..registry import register_reward
from ..serving.client import FrameResults, ServiceError, ServiceReward
from ..serving.wire import encode_image
from . import scoring


@register_reward("geneval")
class GenEvalReward(ServiceReward):
    """GenEval partial credit per image (``avg`` ``[B]``; frames ``[B, K]`` chunks, each frame scored as an image)."""

    uses_metadata = True
    address_hint = "the GenEval detector server (e.g. http://127.0.0.1:18085; see rlrunner/rewards/geneval/README.md)"

    def score_frames(self, frames: np.ndarray, prompts: list[str], reasons: list[str | None],
                     metadata: list[dict[str, Any]]) -> FrameResults:
        flat = frames.reshape((-1,) + frames.shape[2:])
        records = [m for m in metadata for _ in range(frames.shape[1])]
        result = FrameResults(np.zeros(len(flat), dtype=np.float32), list(reasons), [False] * len(flat),
                              {"accuracy": [0.0] * len(flat), "tags": [str(r.get("tag", "")) for r in records]})
        for i, record in enumerate(records):
            bad = scoring.check_metadata(record)
            if result.reasons[i] is None and bad:
                result.reasons[i] = f"no GenEval record ({bad}; prompt {prompts[i // frames.shape[1]][:60]!r})"
        todo = [i for i, r in enumerate(result.reasons) if r is None]
        groups = [todo[k:k + self.spec.batch_size] for k in range(0, len(todo), self.spec.batch_size)]
        for group, answer in zip(groups, self.client.map(lambda g: self._detect([flat[i] for i in g]), groups)):
            for j, i in enumerate(group):
                if isinstance(answer, ServiceError):
                    result.reasons[i], result.unreachable[i] = self.unreachable_reason(answer), True
                    continue
                objects = scoring.select_objects(answer[j], records[i]["tag"])
                result.scores[i] = scoring.partial_score(objects, records[i])[0]
                result.extra["accuracy"][i] = float(scoring.correct(objects, records[i])[0])
        return result

    def _detect(self, images: list[np.ndarray]) -> list[list[Mapping[str, Any]]]:
        """POST one request; runs on the client's request threads."""
        body = self.client.request("POST", f"{self.address}/detect", {"images": [encode_image(im) for im in images]})
        try:
            return scoring.parse_detections(body, len(images))
        except ValueError as err:
            raise ServiceError(f"{self.address}/detect answered {err}") from None

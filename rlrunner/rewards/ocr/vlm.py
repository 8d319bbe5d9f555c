"""``reward.model: vlm_ocr``: a vision-language model reads the text, ``ocr_score`` scores it (as ``ocr``).

Any OpenAI-compatible chat-completions endpoint works: vLLM, SGLang, a hosted API, or ``rlrunner.commands.serve_reward``
(its OCR engine answers as the "model", which is how the tests run this path end to end). Each image (each video
frame) is one request: ``TRANSCRIBE_PROMPT`` with the image as a PNG data URL, ``temperature: 0``; the answer,
filtered to ``alphabet`` if set, is scored with :func:`rlrunner.rewards.ocr.reward.ocr_score`. The endpoint batches
concurrent requests itself (vLLM: continuous batching), so ``max_concurrency`` is the batch size that matters.

Serve Qwen2.5-VL (or Qwen3-VL) with vLLM on its own GPU(s), then point the recipe at it::

    vllm serve Qwen/Qwen2.5-VL-7B-Instruct --served-model-name qwen-vl --port 8001 \\
        --max-model-len 4096 --limit-mm-per-prompt '{"image": 1}' --api-key "$(cat vlm.key)"

    reward: {model: vlm_ocr, base_url: http://127.0.0.1:8001/v1, served_model: qwen-vl, api_key_file: vlm.key}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..registry import register_reward
from ..serving.client import FrameResults, ServiceError, ServiceReward
from ..serving.wire import MalformedMessage, data_url, parse_chat_text
from .reward import filter_alphabet, ocr_score, unscorable

#: The fixed instruction sent with every image. It asks for the text alone so that the answer can be scored like
#: an OCR engine's output (quotes and explanations would cost edit distance).
TRANSCRIBE_PROMPT = (
    "Transcribe all text visible in this image exactly as written. Reply with the text only, without quotes, "
    "labels or explanations. If there is no text, reply with an empty message."
)
#: Longest answer asked for; text in generated images is short.
MAX_TOKENS = 128


@register_reward("vlm_ocr")
class VlmOcrReward(ServiceReward):
    """OCR reward with a VLM as the reader; ``avg`` ``[B]`` for images, ``[B, K]`` chunk rewards for frames.

    ``extra["texts"]`` holds each image's transcription (video: ``B`` lists of ``F``).
    """

    address_key, secret_key, health_path = "base_url", "api_key_file", "/models"
    needs = ("base_url", "served_model")
    address_hint = "e.g. http://127.0.0.1:8001/v1"

    def score_frames(self, frames: np.ndarray, prompts: list[str], reasons: list[str | None],
                     metadata: list[dict[str, Any]]) -> FrameResults:
        flat = frames.reshape((-1,) + frames.shape[2:])
        frame_prompts = [p for p in prompts for _ in range(frames.shape[1])]
        result = FrameResults(np.zeros(len(flat), dtype=np.float32), unscorable(flat, frame_prompts, reasons),
                              [False] * len(flat), {"texts": [""] * len(flat)})
        todo = [i for i, r in enumerate(result.reasons) if r is None]
        for i, answer in zip(todo, self.client.map(lambda i: self._transcribe(flat[i]), todo)):
            if isinstance(answer, ServiceError):
                result.reasons[i], result.unreachable[i] = self.unreachable_reason(answer), True
                continue
            text = filter_alphabet(answer, self.spec.alphabet)
            result.scores[i], result.extra["texts"][i] = ocr_score(text, frame_prompts[i]), text
        return result

    def _transcribe(self, image: np.ndarray) -> str:
        """One chat-completions request for uint8 ``image`` ``[H, W, 3]``; runs on the client's request threads."""
        url = f"{self.address}/chat/completions"
        content = [{"type": "image_url", "image_url": {"url": data_url(image)}},
                   {"type": "text", "text": TRANSCRIBE_PROMPT}]
        body = self.client.request("POST", url, {"model": self.spec.served_model, "temperature": 0.0,
                                                 "max_tokens": MAX_TOKENS,
                                                 "messages": [{"role": "user", "content": content}]})
        try:
            return parse_chat_text(body)
        except MalformedMessage as err:
            raise ServiceError(f"{url} answered malformed JSON: {err}") from None

"""VLM judges on an OpenAI-compatible chat-completions endpoint: ``unifiedreward``, ``unifiedreward2``, ``vlm_yesno``.

Each image (each video frame) is one request with the image as a PNG data URL and the judge's template filled
with the prompt (``reward.judge_prompt`` overrides the template), ``temperature: 0``. The reply is parsed by
:mod:`rlrunner.rewards.judges.parsers`; one that does not parse scores 0 and is counted in ``env/reward_errors``
(reason ``unparsable judge reply``), as a failed request is. Same keys as ``vlm_ocr``: ``base_url``,
``served_model``, ``api_key_file``, ``timeout_s``, ``max_retries``, ``max_concurrency``, ``required``.

    vllm serve CodeGoat24/UnifiedReward-qwen-7b --served-model-name unifiedreward --port 8002 \\
        --limit-mm-per-prompt '{"image": 1}'
    reward: {model: unifiedreward, base_url: http://127.0.0.1:8002/v1, served_model: unifiedreward}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from rlrunner.config.schema import RewardConfig

from ..registry import register_reward
from ..serving.client import FrameResults, ServiceError, ServiceReward
from ..serving.wire import MalformedMessage, data_url, parse_chat_text
from . import parsers

#: The reason (and error key) of a reply without the score the template asks for.
UNPARSABLE = "unparsable judge reply"


class VlmJudgeReward(ServiceReward):
    """A VLM's judgement of each image against its prompt, in [0, 1]; ``avg`` ``[B]`` (frames: ``[B, K]`` chunks).

    Subclasses set ``template``, ``max_tokens`` and how a reply becomes a score: ``score_text`` (the reply's text ->
    score, raising ``parsers.UnparsableReply``), or ``parse`` where the score is not in the text (the yes/no judge
    reads logprobs); ``extra["replies"]`` holds each image's reply text (video: ``B`` lists of ``F``).
    """

    template: ClassVar[str] = ""
    max_tokens: ClassVar[int] = 512
    address_key, secret_key, health_path = "base_url", "api_key_file", "/models"
    needs = ("base_url", "served_model")
    address_hint = "e.g. http://127.0.0.1:8002/v1"

    def __init__(self, spec: RewardConfig) -> None:
        self.prompt_template = spec.judge_prompt or self.template
        parsers.fill_template(self.prompt_template, "")  # a bad override fails here, before any rollout
        super().__init__(spec)

    score_text: ClassVar[Callable[[str], float]]

    def parse(self, body: Any) -> float:
        """The score in [0, 1] of one chat-completions answer; raises ``parsers.UnparsableReply``."""
        return type(self).score_text(parse_chat_text(body))

    def request_options(self) -> dict[str, Any]:
        """Extra chat-completions fields (the yes/no judge asks for logprobs)."""
        return {}

    def score_frames(self, frames: np.ndarray, prompts: list[str], reasons: list[str | None],
                     metadata: list[dict[str, Any]]) -> FrameResults:
        flat = frames.reshape((-1,) + frames.shape[2:])
        frame_prompts = [p for p in prompts for _ in range(frames.shape[1])]
        # a blank image is judged like any other (a judge should rate it low); only unreadable pixels are errors
        result = FrameResults(np.zeros(len(flat), dtype=np.float32), list(reasons), [False] * len(flat),
                              {"replies": [""] * len(flat)})
        todo = [i for i, r in enumerate(result.reasons) if r is None]
        for i, answer in zip(todo, self.client.map(lambda i: self._judge(flat[i], frame_prompts[i]), todo)):
            if isinstance(answer, ServiceError):
                result.reasons[i], result.unreachable[i] = self.unreachable_reason(answer), True
                continue
            result.extra["replies"][i], score = answer
            if isinstance(score, str):  # why the reply did not parse
                result.reasons[i] = f"{UNPARSABLE} ({score})"
            else:
                result.scores[i] = score
        return result

    def _judge(self, image: np.ndarray, prompt: str) -> tuple[str, float | str]:
        """One request for uint8 ``image`` ``[H, W, 3]``: ``(reply text, score or why it did not parse)``."""
        url = f"{self.address}/chat/completions"
        content = [{"type": "image_url", "image_url": {"url": data_url(image)}},
                   {"type": "text", "text": parsers.fill_template(self.prompt_template, prompt)}]
        body = self.client.request("POST", url, {"model": self.spec.served_model, "temperature": 0.0,
                                                 "max_tokens": self.max_tokens, **self.request_options(),
                                                 "messages": [{"role": "user", "content": content}]})
        try:
            reply = parse_chat_text(body)
        except MalformedMessage as err:
            raise ServiceError(f"{url} answered malformed JSON: {err}") from None
        try:
            return reply, self.parse(body)
        except parsers.UnparsableReply as err:
            return reply, str(err)


@register_reward("unifiedreward")
class UnifiedRewardJudge(VlmJudgeReward):
    """UnifiedReward 1.5: ``Final Score: x`` (1..5) -> ``x / 5``."""

    template = parsers.UNIFIEDREWARD_TEMPLATE
    score_text = parsers.parse_final_score


@register_reward("unifiedreward2")
class UnifiedReward2Judge(VlmJudgeReward):
    """UnifiedReward 2.0: Alignment, Coherence and Style (1..5 each) -> ``(mean − 1) / 4``."""

    template = parsers.UNIFIEDREWARD2_TEMPLATE
    score_text = parsers.parse_three_axes


@register_reward("vlm_yesno")
class YesNoJudge(VlmJudgeReward):
    """``P(yes) / (P(yes) + P(no))`` of the reply's first token, from ``reward.top_logprobs`` returned logprobs."""

    template = parsers.YESNO_TEMPLATE
    max_tokens = 1

    def request_options(self) -> dict[str, Any]:
        return {"logprobs": True, "top_logprobs": self.spec.top_logprobs}

    def parse(self, body: Any) -> float:
        return parsers.yes_probability(parsers.first_token_logprobs(body))

"""The judges' prompt templates and the pure parsers that turn a VLM's reply into a score in [0, 1].

No I/O here: :mod:`rlrunner.rewards.judges.judge` sends the requests. A reply that does not parse raises
:class:`UnparsableReply`; the reward counts it as an error (``env/reward_errors``), never as a silent 0.

Templates (``{prompt}`` is the caption; ``reward.judge_prompt`` overrides them):

- UnifiedReward 1.5 (flow_grpo's ``unifiedreward_score_sglang``): alignment + quality judged together, one
  number from 1 to 5 after ``Final Score:``; the reward is ``x / 5`` (flow_grpo's scaling).
- UnifiedReward 2.0 (Pref-GRPO's ``get_unifiedreward_image_template``): three axes rated 1 to 5 (Alignment,
  Coherence, Style); the reward is ``(mean − 1) / 4``.
- yes/no: the VLM answers one token; the reward is ``P(yes) / (P(yes) + P(no))`` over the ``top_logprobs`` of that
  token (every spelling of yes / no the tokenizer offers, e.g. ``Yes``, `` yes``, ``YES``, summed).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

UNIFIEDREWARD_TEMPLATE = (
    "You are given a text caption and a generated image based on that caption. Your task is to evaluate this image "
    "based on two key criteria:\n"
    "1. Alignment with the Caption: Assess how well this image aligns with the provided caption. Consider the "
    "accuracy of depicted objects, their relationships, and attributes as described in the caption.\n"
    "2. Overall Image Quality: Examine the visual quality of this image, including clarity, detail preservation, "
    "color accuracy, and overall aesthetic appeal.\n"
    "Based on the above criteria, assign a score from 1 to 5 after 'Final Score:'.\n"
    "Your task is provided as follows:\nText Caption: [{prompt}]"
)
UNIFIEDREWARD2_TEMPLATE = (
    "You are presented with a generated image and its associated text caption. Your task is to analyze the image "
    "across multiple dimensions in relation to the caption. Specifically:\n"
    "Provide overall assessments for the image along the following axes (each rated from 1 to 5):\n"
    "- Alignment Score: How well the image matches the caption in terms of content.\n"
    "- Coherence Score: How logically consistent the image is (absence of visual glitches, object distortions, "
    "etc.).\n"
    "- Style Score: How aesthetically appealing the image looks, regardless of caption accuracy.\n\n"
    "Output your evaluation using the format below:\n\n"
    "Alignment Score (1-5): X\nCoherence Score (1-5): Y\nStyle Score (1-5): Z\n\n"
    "Your task is provided as follows:\nText Caption: [{prompt}]"
)
YESNO_TEMPLATE = "Does this image show {prompt}? Answer with one word, yes or no."

#: How far above 0 a served logprob may be (float rounding of a certain token) before it is malformed.
LOGPROB_ROUNDING = 1e-4
#: UnifiedReward 2.0's three axes, all required in a reply.
AXES = ("Alignment", "Coherence", "Style")

# Linear time on any reply: `\s*\**\s*` (and `(\w+) Score`) backtracked quadratically, 20 s on 20,000 spaces
_FINAL_SCORE = re.compile(r"Final Score:\s*(?:\*+\s*)?(\d+(?:\.\d+)?)", re.IGNORECASE)
_AXIS_SCORE = re.compile(rf"\b({'|'.join(AXES)}) Score \(1-5\):\s*(?:\*+\s*)?(\d+(?:\.\d+)?)")


class UnparsableReply(ValueError):
    """A judge's reply without the score its template asks for; the message quotes the start of the reply."""


def fill_template(template: str, prompt: str) -> str:
    """``template`` with ``{prompt}`` replaced (other braces are left alone, so templates may show JSON)."""
    if "{prompt}" not in template:
        raise ValueError(f"reward.judge_prompt must contain '{{prompt}}' (where the caption goes), got {template!r}")
    return template.replace("{prompt}", prompt)


def _in_range(value: float, reply: str) -> float:
    if not 1.0 <= value <= 5.0:
        raise UnparsableReply(f"score {value} is outside 1..5 in reply {_quote(reply)}")
    return value


def parse_final_score(reply: str) -> float:
    """UnifiedReward 1.5: the number after the last ``Final Score:``, scaled ``x / 5`` (1 → 0.2, 5 → 1)."""
    matches = _FINAL_SCORE.findall(reply)
    if not matches:
        raise UnparsableReply(f"no 'Final Score: X' in reply {_quote(reply)}")
    return _in_range(float(matches[-1]), reply) / 5.0


def parse_three_axes(reply: str) -> float:
    """UnifiedReward 2.0: ``(mean(Alignment, Coherence, Style) − 1) / 4`` (all 1 → 0, all 5 → 1)."""
    found = {name: float(value) for name, value in _AXIS_SCORE.findall(reply)}
    missing = [axis for axis in AXES if axis not in found]
    if missing:
        raise UnparsableReply(f"no '{missing[0]} Score (1-5): X' in reply {_quote(reply)}")
    mean = sum(_in_range(found[axis], reply) for axis in AXES) / len(AXES)
    return (mean - 1.0) / 4.0


def yes_probability(top_logprobs: Sequence[Mapping[str, Any]]) -> float:
    """``P(yes) / (P(yes) + P(no))`` from one token's ``top_logprobs`` (``[{"token": str, "logprob": float}]``).

    Tokens are compared stripped and lower-cased, so ``Yes``, `` yes`` and ``YES`` all count as yes. A logprob
    that is not a finite number <= 0 (NaN, inf, 1000, null, a string: a broken endpoint) is UnparsableReply, so
    one bad answer costs one sample, never a NaN reward or the run.
    """
    mass = {"yes": 0.0, "no": 0.0}
    for entry in top_logprobs:
        word = str(entry.get("token", "")).strip().lower()
        if word in mass:
            mass[word] += math.exp(_logprob(entry.get("logprob")))
    total = mass["yes"] + mass["no"]
    if total <= 0.0:
        tokens = [e.get("token") for e in top_logprobs][:5]
        raise UnparsableReply(f"neither yes nor no among the top tokens {tokens} (raise reward.top_logprobs?)")
    return mass["yes"] / total


def _logprob(value: Any) -> float:
    """``value`` as a log-probability; up to LOGPROB_ROUNDING above 0 is taken as 0 (servers round)."""
    try:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer too long for a float
        number = math.nan
    if not math.isfinite(number):
        raise UnparsableReply(f"logprob {str(value)[:40]} is not a finite number")
    if number > LOGPROB_ROUNDING:
        raise UnparsableReply(f"logprob {number!r} is above 0 (a probability over 1)")
    return min(number, 0.0)


def first_token_logprobs(body: Any) -> list[dict[str, Any]]:
    """``choices[0].logprobs.content[0].top_logprobs`` of a chat-completions answer (OpenAI / vLLM layout)."""
    try:
        entries = body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise UnparsableReply("no choices[0].logprobs.content[0].top_logprobs in the answer (does the endpoint "
                              "support logprobs? vLLM does)") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "logprob" in e for e in entries):
        raise UnparsableReply(f"top_logprobs is not a list of {{token, logprob}} objects: {str(entries)[:120]}")
    return entries


def _quote(reply: str) -> str:
    text = " ".join(reply.split())
    return repr(text[:80] + ("..." if len(text) > 80 else ""))

"""VLM judges: the reply parsers on real-looking replies (and malformed ones), the yes/no logprob math by hand, and
each judge end to end against a stub OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from service_helpers import StubServer

from rlrunner.rewards import build_reward
from rlrunner.rewards.judges import UnparsableReply, parse_final_score, parse_three_axes, yes_probability
from rlrunner.rewards.judges.parsers import first_token_logprobs

UNIFIEDREWARD_REPLY = (
    "The image shows a red bicycle leaning on a brick wall, as the caption says; the spokes are slightly "
    "distorted and the lighting is flat.\nFinal Score: 3.5"
)
UNIFIEDREWARD2_REPLY = "Alignment Score (1-5): 4\nCoherence Score (1-5): 3.5\nStyle Score (1-5): 5\n"


def test_final_score_is_scaled_by_five():
    assert parse_final_score(UNIFIEDREWARD_REPLY) == pytest.approx(3.5 / 5)
    assert parse_final_score("final score: **5**") == pytest.approx(1.0)
    # a score quoted in the reasoning, then the verdict: the last one counts
    assert parse_final_score("A Final Score: 1 would be unfair.\nFinal Score: 4") == pytest.approx(0.8)


@pytest.mark.parametrize("reply", ["The image is good. Score: 4", "Final Score: seven", "Final Score: 9", ""])
def test_final_score_malformed(reply):
    with pytest.raises(UnparsableReply):
        parse_final_score(reply)


def test_three_axes_mean_minus_one_over_four():
    # mean(4, 3.5, 5) = 4.1667 -> (4.1667 - 1) / 4 = 0.79167
    assert parse_three_axes(UNIFIEDREWARD2_REPLY) == pytest.approx((12.5 / 3 - 1) / 4)
    assert parse_three_axes("Alignment Score (1-5): 1\nCoherence Score (1-5): 1\nStyle Score (1-5): 1") == 0.0


@pytest.mark.parametrize("reply", [
    "Alignment Score (1-5): 4\nStyle Score (1-5): 5",  # an axis missing
    "Alignment Score (1-5): 4\nCoherence Score (1-5): 0\nStyle Score (1-5): 5",  # out of range
    "Alignment: 4, Coherence: 3, Style: 5",  # not the template's format
])
def test_three_axes_malformed(reply):
    with pytest.raises(UnparsableReply):
        parse_three_axes(reply)


def test_yes_probability_by_hand():
    top = [{"token": "Yes", "logprob": math.log(0.6)}, {"token": " yes", "logprob": math.log(0.1)},
           {"token": "No", "logprob": math.log(0.2)}, {"token": "Maybe", "logprob": math.log(0.1)}]
    # (0.6 + 0.1) / (0.6 + 0.1 + 0.2): "Maybe" is left out of the normalisation
    assert yes_probability(top) == pytest.approx(0.7 / 0.9)
    assert yes_probability([{"token": "NO", "logprob": -0.01}]) == 0.0


def test_yes_probability_without_yes_or_no():
    with pytest.raises(UnparsableReply, match="neither yes nor no"):
        yes_probability([{"token": "The", "logprob": -0.1}])
    with pytest.raises(UnparsableReply, match="logprobs"):
        first_token_logprobs({"choices": [{"message": {"content": "Yes"}, "logprobs": None}]})


def chat_answer(content: str, top: list[dict] | None = None) -> tuple[int, bytes]:
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    if top is not None:
        choice["logprobs"] = {"content": [{"token": content, "logprob": top[0]["logprob"], "top_logprobs": top}]}
    return 200, json.dumps({"choices": [choice]}).encode()


def images(n: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)


def judge_config(model: str, url: str, **keys) -> dict:
    return {"model": model, "base_url": f"{url}/v1", "served_model": "judge", "max_retries": 0, **keys}


def test_unifiedreward_end_to_end_counts_unparsable_replies():
    seen = []

    def answer(body: dict) -> tuple[int, bytes]:
        text = body["messages"][0]["content"][1]["text"]
        seen.append(body)
        return chat_answer("I cannot rate this." if "broken" in text else "Looks fine.\nFinal Score: 4")

    with StubServer(answer) as stub:
        reward = build_reward(judge_config("unifiedreward", stub.url))
        out = reward(images(3), ["a cat", "a broken prompt", "a dog"])
    np.testing.assert_allclose(out.avg, [0.8, 0.0, 0.8])
    assert out.errors == 1 and out.extra["error_mask"].tolist() == [False, True, False]
    assert out.extra["error_reasons"] == {"unparsable judge reply": 1}
    assert out.extra["replies"][1] == "I cannot rate this."
    assert out.failure == ""
    assert all(b["model"] == "judge" and b["temperature"] == 0.0 for b in seen)
    assert all(b["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,") for b in seen)
    # requests run concurrently: compare the captions as a set
    assert {b["messages"][0]["content"][1]["text"].rsplit("\n", 1)[1] for b in seen} == {
        "Text Caption: [a cat]", "Text Caption: [a broken prompt]", "Text Caption: [a dog]"}


def test_unifiedreward2_and_template_override():
    with StubServer(lambda body: chat_answer(UNIFIEDREWARD2_REPLY)) as stub:
        reward = build_reward(judge_config("unifiedreward2", stub.url, judge_prompt="Rate: {prompt}"))
        out = reward(images(2), ["a", "b"])
    np.testing.assert_allclose(out.avg, [(12.5 / 3 - 1) / 4] * 2, rtol=1e-6)
    with pytest.raises(ValueError, match="judge_prompt"):
        build_reward(judge_config("unifiedreward2", "http://127.0.0.1:9", judge_prompt="no caption slot"))


def test_yesno_end_to_end_reads_logprobs():
    seen = []

    def answer(body: dict) -> tuple[int, bytes]:
        seen.append(body)
        return chat_answer("Yes", [{"token": "Yes", "logprob": math.log(0.75)},
                                   {"token": "No", "logprob": math.log(0.25)}])

    with StubServer(answer) as stub:
        out = build_reward(judge_config("vlm_yesno", stub.url, top_logprobs=5))(images(1), ["a red cube"])
    np.testing.assert_allclose(out.avg, [0.75])
    assert seen[0]["logprobs"] is True and seen[0]["top_logprobs"] == 5 and seen[0]["max_tokens"] == 1
    assert "Does this image show a red cube?" in seen[0]["messages"][0]["content"][1]["text"]


def test_every_reply_unparsable_is_a_failure():
    with StubServer(lambda body: chat_answer("no idea")) as stub:
        out = build_reward(judge_config("unifiedreward", stub.url))(images(2), ["a", "b"])
    assert out.errors == 2 and "unparsable judge reply" in out.failure


BROKEN_LOGPROBS = [math.nan, math.inf, -math.inf, 1000, None, "-0.1", True, 10**400]


@pytest.mark.parametrize("logprob", BROKEN_LOGPROBS,
                         ids=["nan", "inf", "-inf", "1000", "null", "string", "bool", "huge-int"])
def test_a_broken_logprob_does_not_parse(logprob):
    with pytest.raises(UnparsableReply, match="logprob"):
        yes_probability([{"token": "Yes", "logprob": logprob}, {"token": "No", "logprob": -1.0}])


def test_a_broken_logprob_is_one_unparsable_sample_not_a_nan_reward_or_a_crash():
    """A judge endpoint answering NaN / inf / 1000 / null as the yes logprob costs that sample (scored 0, counted)
    and nothing else; before, NaN became the reward and 1000 or null raised past the per-sample handling."""
    broken = []  # the logprob the stub sends for the "broken" prompt

    def answer(body: dict) -> tuple[int, bytes]:
        bad = "broken" in body["messages"][0]["content"][1]["text"]
        top = [{"token": "Yes", "logprob": broken[0] if bad else math.log(0.75)},
               {"token": "No", "logprob": math.log(0.25)}]
        return chat_answer("Yes", top)  # json.dumps writes NaN / Infinity as Python does (vLLM can too)

    with StubServer(answer) as stub:
        reward = build_reward(judge_config("vlm_yesno", stub.url))
        for logprob in BROKEN_LOGPROBS:
            broken[:] = [logprob]
            out = reward(images(2), ["a broken cube", "a red cube"])
            assert np.isfinite(out.avg).all() and out.avg.tolist() == pytest.approx([0.0, 0.75]), logprob
            assert out.errors == 1 and out.extra["error_reasons"] == {"unparsable judge reply": 1}
            assert out.failure == ""
        everything_broken = reward(images(1), ["a broken cube"])
    assert "unparsable judge reply" in everything_broken.failure  # required (the default): all failed stops the run


def test_a_logprob_rounded_just_above_zero_is_certainty():
    assert yes_probability([{"token": "Yes", "logprob": 1e-7}, {"token": "No", "logprob": -30.0}]) == pytest.approx(1.0)

"""Property-based fuzz (hypothesis, derandomized: the same inputs every run) of the parsers that read what a
network peer sent: the reward server's request checks and the wire format both sides read, the judges' replies,
and a GenEval detector's detections. Each property: any input is either parsed into values in range or refused
with the parser's own error (which the callers count per sample or answer as 400/413), never another exception,
a NaN, or a quadratic-time regex. The inputs tried per target are printed (docs/security.md "Fuzz campaign" quotes
them)."""

from __future__ import annotations

import base64
import io
import json
import math
import time
from collections import Counter

import numpy as np
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from rlrunner.rewards.geneval import scoring
from rlrunner.rewards.judges import parsers
from rlrunner.rewards.serving import server, wire

#: Hypothesis's fixed-seed mode: the same examples each run, so CI is deterministic and the counts are stable.
FUZZ = settings(derandomize=True, deadline=None, database=None, max_examples=150,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TRIED: Counter[str] = Counter()
#: Longest a single parse may take on inputs of at most a few kB (a quadratic regex took 20 s on 20 kB).
PARSE_BUDGET_S = 0.5

numbers = (st.integers() | st.integers(min_value=10**300, max_value=10**400) | st.booleans()
           | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([math.nan, math.inf, -math.inf, 1e308]))
scalars = st.none() | numbers | st.text(max_size=20)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=5), max_leaves=25)


def near(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Well-formed-but-hostile inputs: a valid structure whose parts are, one time in four, any JSON value."""
    return st.one_of(valid, valid, valid, json_values)


def timed(target: str, fn, *args):
    """``fn(*args)``, counted under ``target`` and held to PARSE_BUDGET_S."""
    TRIED[target] += 1
    started = time.monotonic()
    try:
        return fn(*args)
    finally:
        assert time.monotonic() - started < PARSE_BUDGET_S, f"{target} took {time.monotonic() - started:.2f} s"


# -- the reward wire format -----------------------------------------------------------------------------------------

score_answers = st.fixed_dictionaries({
    "rewards": st.lists(near(st.floats(0, 1) | st.lists(st.floats(0, 1), max_size=3)), max_size=4),
    "errors": st.lists(near(st.none() | st.text(max_size=10) | st.lists(st.none(), max_size=3)), max_size=4),
}) | json_values
frame_counts = st.lists(st.none() | st.integers(1, 3), max_size=4)


@FUZZ
@given(body=score_answers, frames=frame_counts)
def test_score_answers_parse_to_finite_pairs_or_malformed_message(body, frames):
    try:
        samples = timed("wire.parse_score_response", wire.parse_score_response, body, frames)
    except wire.MalformedMessage:
        return
    assert [len(s) for s in samples] == [count or 1 for count in frames]
    assert all(math.isfinite(score) and (error is None or isinstance(error, str)) for s in samples for score, error in s)


def png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


VALID_PNG = png_bytes(np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3))


@st.composite
def image_texts(draw) -> str:
    """base64 text of: random bytes, a valid PNG with bytes flipped or cut, or plain text that is not base64."""
    kind = draw(st.sampled_from(["bytes", "mutated", "truncated", "text"]))
    if kind == "text":
        return draw(st.text(max_size=40))
    data = bytearray(VALID_PNG)
    if kind == "bytes":
        data = bytearray(draw(st.binary(max_size=200)))
    elif kind == "mutated":
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    else:
        data = data[: draw(st.integers(0, len(data)))]
    return base64.b64encode(bytes(data)).decode()


@FUZZ
@given(text=image_texts() | json_values)
def test_image_payloads_decode_within_limits_or_are_refused(text):
    try:
        image = timed("wire.decode_image", wire.decode_image, text, 64 * 64)
    except (wire.MalformedMessage, wire.TooLarge):
        return
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert image.shape[0] * image.shape[1] <= 64 * 64


@settings(FUZZ, max_examples=60)
@given(image=arrays(np.uint8, st.tuples(st.integers(1, 12), st.integers(1, 12), st.just(3))))
def test_encoded_images_decode_to_the_same_pixels_within_their_size_bound(image):
    text = wire.encode_image(image)
    assert len(text) <= wire.encoded_size_bound(*image.shape[:2])  # what remote sizes its requests by
    np.testing.assert_array_equal(timed("wire.encode/decode round trip", wire.decode_image, text, 144), image)


score_requests = st.fixed_dictionaries({
    "prompts": st.lists(near(st.text(max_size=10)), max_size=4),
    "images": st.lists(near(st.text(max_size=10) | st.lists(st.text(max_size=10), max_size=3)), max_size=4),
}) | json_values


@FUZZ
@given(body=score_requests)
def test_score_requests_are_checked_into_400_or_413(body):
    try:
        prompts, images = timed("server /score request checks", server._score_request, body, 6)
    except web.HTTPException as err:
        assert err.status in (400, 413) and err.text
        return
    assert len(prompts) == len(images) and all(isinstance(p, str) for p in prompts)
    assert sum(len(e) if isinstance(e, list) else 1 for e in images) <= 6


chat_requests = st.fixed_dictionaries({"messages": st.lists(near(st.fixed_dictionaries({"content": st.lists(near(
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": near(st.fixed_dictionaries({
        "url": near(st.just("data:image/png;base64,") | st.text(max_size=30))}))})), max_size=3)})), max_size=3)})


@FUZZ
@given(body=chat_requests | json_values)
def test_chat_requests_yield_base64_payloads_or_400(body):
    try:
        images = timed("server chat request checks", server._chat_images, body)
    except web.HTTPException as err:
        assert err.status == 400 and err.text
        return
    assert images and all(isinstance(i, str) for i in images)


@FUZZ
@given(body=near(st.fixed_dictionaries({"choices": st.lists(st.fixed_dictionaries({"message": near(
    st.fixed_dictionaries({"content": near(st.text(max_size=30))}))}), max_size=2)})))
def test_chat_answers_give_text_or_malformed_message(body):
    try:
        text = timed("wire.parse_chat_text", wire.parse_chat_text, body)
    except wire.MalformedMessage:
        return
    assert isinstance(text, str)


# -- judge replies --------------------------------------------------------------------------------------------------

hostile_numbers = st.sampled_from(["4", "5.0", "0", "9", "3.75", "1" * 400, "4." + "9" * 300, "-1", "NaN", "", "**4"])
template_replies = st.builds(
    lambda pad, a, b, c, tail: f"{pad}Alignment Score (1-5): {a}\nCoherence Score (1-5):{pad}{b}\n"
                               f"Style Score (1-5): **{c}**\nFinal Score:{pad}{a}{tail}",
    st.sampled_from(["", " ", " " * 3000, "*" * 50, "\n\t" * 500]), hostile_numbers, hostile_numbers,
    hostile_numbers, st.text(max_size=20))


@FUZZ
@given(reply=template_replies | st.text(max_size=300) | st.text(alphabet=" *:Score(1-5)Final", max_size=3000))
def test_judge_replies_score_in_range_or_are_unparsable(reply):
    for name, parse in (("judge parse_final_score", parsers.parse_final_score),
                        ("judge parse_three_axes", parsers.parse_three_axes)):
        try:
            score = timed(name, parse, reply)
        except parsers.UnparsableReply:
            continue
        assert 0.0 <= score <= 1.0


logprob_answers = st.fixed_dictionaries({"choices": st.lists(st.fixed_dictionaries({"logprobs": near(
    st.fixed_dictionaries({"content": st.lists(st.fixed_dictionaries({"top_logprobs": near(st.lists(near(
        st.fixed_dictionaries({"token": near(st.sampled_from(["Yes", " no", "YES", "maybe"])),
                               "logprob": near(st.floats(max_value=0.0) | numbers)})), max_size=4))}),
        min_size=1, max_size=2)}))}), min_size=1, max_size=2)})


@FUZZ
@given(body=logprob_answers | json_values)
def test_yes_no_answers_give_a_probability_or_are_unparsable(body):
    try:
        p = timed("judge yes/no logprobs", lambda b: parsers.yes_probability(parsers.first_token_logprobs(b)), body)
    except parsers.UnparsableReply:
        return
    assert math.isfinite(p) and 0.0 <= p <= 1.0


# -- GenEval detections ---------------------------------------------------------------------------------------------

detections = st.fixed_dictionaries({
    "label": near(st.sampled_from(["cat", "car", "bench", "vase"])),
    "box": near(st.lists(near(st.floats(-1e6, 1e6) | numbers), min_size=4, max_size=4)),
    "score": near(st.floats(0, 1) | numbers),
    "color": near(st.none() | st.sampled_from(list(scoring.COLORS))),
})
detector_answers = st.fixed_dictionaries({"detections": st.lists(near(st.lists(near(detections), max_size=6)),
                                                                 min_size=1, max_size=3)}) | json_values
RECORDS = [
    {"tag": "counting", "include": [{"class": "cat", "count": 2}]},
    {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]},
    {"tag": "position", "include": [{"class": "bench", "count": 1},
                                    {"class": "vase", "count": 1, "position": ["left of", 0]}]},
    {"tag": "two_object", "include": [{"class": "cat", "count": 1}, {"class": "car", "count": 1}],
     "exclude": [{"class": "vase", "count": 1}]},
]


@FUZZ
@given(body=detector_answers)
def test_detector_answers_are_parsed_or_refused(body):
    count = len(body["detections"]) if isinstance(body, dict) and isinstance(body.get("detections"), list) else 1
    try:
        per_image = timed("geneval parse_detections", scoring.parse_detections, body, count)
    except ValueError:
        return
    json.dumps(per_image, allow_nan=False)  # what was accepted is plain JSON data with finite numbers
    for found in per_image:
        score_every_record(found)


extreme = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(10**300), 10**300)
valid_detections = st.lists(st.fixed_dictionaries({
    "label": st.sampled_from(["cat", "car", "bench", "vase", ""]), "box": st.lists(extreme, min_size=4, max_size=4),
    "score": extreme, "color": st.none() | st.sampled_from([*scoring.COLORS, "teal"])}), max_size=8)


@FUZZ
@given(found=valid_detections)
def test_extreme_but_valid_detections_score_in_range(found):
    assert scoring.parse_detections({"detections": [found]}, 1) == [found]
    score_every_record(found)


def score_every_record(found: list) -> None:
    for record in RECORDS:
        objects = timed("geneval scoring", scoring.select_objects, found, record["tag"])
        score, strict = scoring.partial_score(objects, record)
        ok, reasons = scoring.correct(objects, record)
        # not >= 0: the anchors' count credit 1 - |count - n| / count is negative past 2 * count objects (n is at
        # most MAX_OBJECTS per class), as their reward is
        assert math.isfinite(score) and 1 - scoring.MAX_OBJECTS <= score <= 1.0
        assert isinstance(strict, bool) and isinstance(ok, bool) and all(isinstance(r, str) for r in reasons)


def test_every_target_was_fuzzed_and_the_counts_are_printed(capsys):
    """Last in this file: the campaign's figures (docs/security.md "Fuzz campaign" quotes them); each target got its
    inputs."""
    with capsys.disabled():
        print(f"\nparser fuzz, inputs tried per target: {dict(sorted(TRIED.items()))}")
    if len(TRIED) < 10:
        pytest.skip("run the whole file to fuzz every target")
    assert min(TRIED.values()) >= 60

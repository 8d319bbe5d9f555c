"""Rewards as a service: the real reward server process and the remote / vlm_ocr clients against it, and the
faults (server down, 401, 413, 400, 500, malformed answers, timeouts) against real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import requests
from reward_helpers import render, requires_engine
from service_helpers import StubServer, free_port, reward_server

from rlrunner.commands.serve_reward import main as serve_main
from rlrunner.rewards import RewardOutput, RewardUnavailable, build_reward
from rlrunner.rewards.serving.wire import encode_image

pytestmark = requires_engine
TOKEN = "s3cret-token"
OCR = {"engine": "rapidocr", "rec_only": True}
PROMPTS = ['a sign that says "2345"', 'a sign that says "6789"', 'a label "7777"', 'a sign "2345"', 'empty ""']


def digits(text: str, seed: int = 0) -> np.ndarray:
    return render(text, size=(96, 32), font_size=24, background="noise", seed=seed)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    """uint8 [5, 32, 96, 3]: two matching, one misread target, one blank, one with an empty target."""
    blank = np.full((32, 96, 3), 200, dtype=np.uint8)
    return np.stack([digits("2345"), digits("6789", 1), digits("7717", 2), blank, digits("2345", 3)])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("token") / "reward.token"
    token_file.write_text(TOKEN + "\n")
    with reward_server("--engine", "rapidocr", "--set", "rec_only=true", "--token-file", str(token_file),
                       "--max-batch", "16", "--max-request-mb", "0.25", token=TOKEN) as (url, _):
        yield {"url": url, "token_file": str(token_file)}


def images_scored(server) -> int:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return requests.get(f"{server['url']}/health", headers=headers, timeout=10).json()["images_scored"]


def remote(server, **keys) -> object:
    return build_reward({"model": "remote", "url": server["url"], "token_file": server["token_file"], **keys})


def vlm(server, **keys) -> object:
    return build_reward({"model": "vlm_ocr", "base_url": server["url"] + "/v1", "served_model": "rlrunner-ocr",
                         "api_key_file": server["token_file"], **OCR, **keys})


def assert_same(out: RewardOutput, expected: RewardOutput) -> None:
    np.testing.assert_array_equal(out.avg, expected.avg)
    np.testing.assert_array_equal(out.extra["error_mask"], expected.extra["error_mask"])
    assert out.errors == expected.errors and out.failure == expected.failure == ""


def test_remote_and_vlm_ocr_score_exactly_like_the_local_ocr_reward(server, images):
    expected = build_reward({"model": "ocr", **OCR})(images, PROMPTS)
    assert expected.avg[:2].tolist() == [1.0, 1.0] and expected.avg[2] == 0.75 and expected.errors == 2
    # batch_size 2: three requests in flight; a pickled client (as Ray ships it) works as well
    for reward in (remote(server, batch_size=2), pickle.loads(pickle.dumps(vlm(server)))):
        out = reward(images, PROMPTS)
        assert_same(out, expected)
        np.testing.assert_array_equal(out.parts[reward.name], expected.avg)
    assert vlm(server)(images, PROMPTS).extra["texts"][:3] == expected.extra["texts"][:3]


def test_video_frames_travel_whole_and_are_chunked_like_video_ocr(server, images):
    frames = np.stack([images[[0, 1, 2, 0, 4]], images[[1, 1, 0, 3, 1]]])  # [2, 5, 32, 96, 3]
    prompts = PROMPTS[:2]
    expected = build_reward({"model": "video_ocr", **OCR})(frames, prompts)  # chunks [f0, mean(f1..f4)]
    for reward in (remote(server, batch_size=4), vlm(server)):  # 4 images per request: one video each
        out = reward(frames, prompts)
        assert out.avg.shape == (2, 2)
        assert_same(out, expected)
        np.testing.assert_array_equal(out.extra["frame_scores"], expected.extra["frame_scores"])


def test_requests_without_or_with_a_wrong_token_get_401_and_nothing_is_scored(server, images):
    body = {"prompts": PROMPTS[:1], "images": [encode_image(images[0])]}
    before = images_scored(server)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        answer = requests.post(f"{server['url']}/score", json=body, headers=headers, timeout=30)
        assert answer.status_code == 401 and "bearer token" in answer.json()["error"]
    assert requests.get(f"{server['url']}/health", timeout=10).status_code == 401
    assert images_scored(server) == before
    with pytest.raises(RewardUnavailable, match="HTTP 401: missing or wrong bearer token"):
        build_reward({"model": "remote", "url": server["url"]})  # required: the check at build time says why
    out = build_reward({"model": "remote", "url": server["url"], "required": False})(images[:2], PROMPTS[:2])
    assert out.avg.tolist() == [0.0, 0.0] and out.errors == 2 and out.failure == ""
    assert images_scored(server) == before


def test_oversized_and_malformed_requests_get_413_and_400_naming_the_problem(server, images):
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    def post(payload: object) -> requests.Response:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return requests.post(f"{server['url']}/score", data=data, headers=headers, timeout=30)

    noise = np.random.default_rng(0).integers(0, 256, (300, 300, 3), dtype=np.uint8)  # ~360 kB as base64 PNG
    answer = post({"prompts": ["x"], "images": [encode_image(noise)]})
    assert answer.status_code == 413 and "262144" in answer.json()["error"]  # --max-request-mb 0.25
    one = encode_image(images[0])
    answer = post({"prompts": ["x"] * 17, "images": [one] * 17})
    assert answer.status_code == 413 and "17 images" in answer.json()["error"] and "--max-batch" in answer.text
    answer = post({"prompts": ["x"] * 2, "images": [[one] * 9, [one] * 8]})  # video frames count
    assert answer.status_code == 413
    assert post(b"not json").status_code == 400
    assert "expected" in post({"prompts": ["x"]}).json()["error"]
    assert "1 prompts for 2 images" in post({"prompts": ["x"], "images": [one, one]}).json()["error"]
    answer = post({"prompts": ["x", "y"], "images": [one, "%%%"]})
    assert answer.status_code == 400 and answer.json()["error"].startswith("images[1]: not base64")
    gif = encode_image(images[0]).replace("iVBOR", "R0lGO")  # corrupt PNG header: not a PNG or JPEG
    assert post({"prompts": ["x"], "images": [gif]}).status_code == 400
    chat = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}
    answer = requests.post(f"{server['url']}/v1/chat/completions", json=chat, headers=headers, timeout=30)
    assert answer.status_code == 400 and "fetches nothing" in answer.json()["error"]


def test_the_server_refuses_to_start_off_loopback_without_a_token_or_with_a_video_reward(capsys):
    assert serve_main(["--host", "0.0.0.0", "--port", str(free_port())]) == 2
    assert "give a --token-file" in capsys.readouterr().err
    assert serve_main(["--reward", "video_ocr", "--engine", "rapidocr", "--port", str(free_port())]) == 2
    assert "--reward video_ocr does not score images (video_ocr expects frames" in capsys.readouterr().err
    assert serve_main(["--set", "rec_only=maybe"]) == 2
    assert "rec_only is true or false" in capsys.readouterr().err


def test_server_down_at_start_fails_at_build_when_required_and_scores_zero_otherwise(images):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(RewardUnavailable, match=f"{url}/health failed after 2 attempt.*Connection refused"):
        build_reward({"model": "remote", "url": url, "max_retries": 1})
    with pytest.raises(RewardUnavailable, match=f"{url}/v1/models"):
        build_reward({"model": "vlm_ocr", "base_url": url + "/v1", "served_model": "m", "max_retries": 0})
    out = build_reward({"model": "remote", "url": url, "required": False, "max_retries": 0})(images, PROMPTS)
    assert out.avg.tolist() == [0.0] * 5 and out.errors == 5 and out.failure == ""
    assert out.extra["error_reasons"] == {"reward service unavailable": 5}


def answer_with(status: int, body: bytes = b"") -> object:
    return lambda _request: (status, body)


@pytest.mark.parametrize(
    ("answer", "delay_s", "expected_error", "attempts"),
    [
        (answer_with(500, b'{"error": "boom"}'), 0.0, "HTTP 500: boom", 3),  # retried, then given up
        (answer_with(200, b"<html>"), 0.0, "not JSON", 1),  # a broken answer is not retried
        (answer_with(200, b'{"rewards": [1.0]}'), 0.0, "malformed JSON: expected a JSON object with", 1),
        (answer_with(200, b'{"rewards": [1.0], "errors": [null]}'), 0.0, "expected 2 rewards", 1),
        (answer_with(200, b'{"rewards": [0.5, NaN], "errors": [null, null]}'), 0.0, "finite numbers", 1),
        (answer_with(200, b'{"rewards": [1, 1], "errors": [null, null]}'), 1.0, "no answer within timeout_s=0.3",
         3),
    ],
    ids=["500", "not-json", "no-errors", "short", "nan", "slow"],
)
def test_faulty_answers_score_zero_count_as_errors_and_fail_a_required_reward(images, answer, delay_s,
                                                                              expected_error, attempts):
    with StubServer(answer, delay_s) as stub:
        spec = {"model": "remote", "url": stub.url, "timeout_s": 0.3, "max_retries": 2}
        out = build_reward(spec)(images[:2], PROMPTS[:2])
        assert stub.requests == attempts
        assert out.avg.tolist() == [0.0, 0.0] and out.errors == 2
        assert stub.url in out.failure and expected_error in out.failure
        optional = build_reward({**spec, "required": False, "max_retries": 0})(images[:2], PROMPTS[:2])
        assert optional.errors == 2 and optional.failure == ""


def test_a_transient_failure_is_retried_with_backoff_and_then_scores():
    calls = []  # the stub's answers: two 503s, then scores

    def flaky(request: dict) -> tuple[int, bytes]:
        calls.append(request)
        if len(calls) < 3:
            return 503, b'{"error": "warming up"}'
        return 200, json.dumps({"rewards": [0.25] * len(request["prompts"]),
                                "errors": [None] * len(request["prompts"]), "parts": {}}).encode()

    image = digits("2345")[None]
    with StubServer(flaky) as stub:
        out = build_reward({"model": "remote", "url": stub.url, "max_retries": 3})(image, PROMPTS[:1])
    assert out.avg.tolist() == [0.25] and out.errors == 0 and len(calls) == 3


def test_failure_marks_only_batches_that_no_sample_survives(images):
    ocr = build_reward({"model": "ocr", **OCR})
    blank = np.full_like(images[:2], 128)
    assert ocr(images[:2], PROMPTS[:2]).failure == ""
    dead = ocr(blank, PROMPTS[:2])
    assert dead.failure.startswith("all 2 images were unscorable; the last one: blank image")
    assert RewardOutput.concat([dead, dead]).failure == dead.failure
    assert RewardOutput.concat([dead, ocr(images[:2], PROMPTS[:2])]).failure == ""
    multi = build_reward({"type": "multi", **OCR, "rewards": [{"model": "ocr"}, {"model": "image_stats"}]})
    assert multi(blank, PROMPTS[:2]).failure.startswith("ocr: all 2 images")


@pytest.mark.parametrize("model, message", [
    ("remote", ("reward.model=remote needs reward.url, e.g. http://127.0.0.1:8000 (start the server with: "
               "bin/rlrunner serve_reward --reward ocr)")),
    ("geneval", "reward.model=geneval needs reward.url, the GenEval detector server (e.g. http://127.0.0.1:18085"),
    ("vlm_ocr", "reward.model=vlm_ocr needs reward.base_url (e.g. http://127.0.0.1:8001/v1) and reward.served_model"),
    ("unifiedreward", ("reward.model=unifiedreward needs reward.base_url (e.g. http://127.0.0.1:8002/v1) and "
                      "reward.served_model")),
])
def test_a_service_reward_without_its_address_says_which_key_to_set(model, message):
    with pytest.raises(ValueError) as err:
        build_reward({"model": model})
    assert str(err.value).startswith(message)

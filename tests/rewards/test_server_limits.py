"""Both servers (the reward server and the GenEval detector server, each in a process of its own on 127.0.0.1)
under requests that are malformed, oversized or hostile: every one is answered with a JSON error and its status,
pixels are added up from image headers before any decode, a fault of the server is the only 500, and the client
retries only that; the remote reward splits a video longer than the server's limits."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import requests
from aiohttp import web
from service_helpers import SERVER_LIMITS, Server, StubServer, peak_rss_mib, raw_request

from rlrunner.config.schema import RewardConfig
from rlrunner.rewards import build_reward
from rlrunner.rewards.image_stats import ImageStatsReward
from rlrunner.rewards.serving.server import Limits, build_app
from rlrunner.rewards.serving.wire import encode_image

TIMEOUT_S = SERVER_LIMITS.timeout_s  # the servers' body timeout here, so a truncated body is answered quickly


def png(width: int, height: int, value: int = 0) -> str:
    """base64 PNG of a solid image: a few kB for millions of pixels (what a pixel bomb is made of)."""
    return encode_image(np.full((height, width, 3), value, dtype=np.uint8))


def bomb_header(width: int, height: int) -> str:
    """base64 of a PNG whose header claims ``width`` x ``height`` (no pixel data follows)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")).decode()


@pytest.fixture(params=["reward", "detector"])
def target(request, reward_service, detector_service) -> Server:
    """One of the two servers (tests/rewards/conftest.py)."""
    return reward_service if request.param == "reward" else detector_service


def post(route: str, body: bytes, headers: str = "Content-Type: application/json\r\n",
         length: str | None = None) -> bytes:
    length = str(len(body)) if length is None else length
    return (f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}"
            + (f"Content-Length: {length}\r\n" if length != "none" else "") + "\r\n").encode() + body


MALFORMED = {  # name: (request bytes given the route, expected status, fragment of the error)
    "negative length": (lambda r: post(r, b"{}", length="-1"), 400, "Content-Length"),
    "non-numeric length": (lambda r: post(r, b"{}", length="abc"), 400, "Content-Length"),
    "missing length": (lambda r: post(r, b"", length="none"), 411, "Content-Length"),
    "length over the limit": (lambda r: post(r, b"{}", length=str(10**12)), 413, "limit"),
    "text/plain (a CORS-simple post)": (lambda r: post(r, b"{}", "Content-Type: text/plain\r\n"), 415, "json"),
    "deeply nested JSON": (lambda r: post(r, b"[" * 100_000 + b"]" * 100_000), 400, "nested"),
    "not JSON": (lambda r: post(r, b"\xff\xfe garbage"), 400, "JSON"),
    "truncated body": (lambda r: post(r, b'{"images": [', length="1000"), 408, "did not arrive"),
    "garbled request line": (lambda r: b"GARBAGE\r\n\r\n", 400, ""),
    "unknown method": (lambda r: f"PUT {r} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode(), 405, ""),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_requests_get_a_json_error_with_their_status_never_a_dropped_connection(target, case):
    request, status, fragment = MALFORMED[case]
    started = time.monotonic()
    got, body = raw_request(target.port, request(target.route))
    assert got == status, (case, body[:200])
    assert fragment.lower() in json.loads(body)["error"].lower()
    assert time.monotonic() - started < TIMEOUT_S + 10  # a late body is answered after the timeout, not later


def test_pixels_are_added_up_from_headers_before_any_image_is_decoded(target):
    """8 solid 2048² PNGs (~130 kB of body) hold 33 M pixels, 100 MB decoded: refused from their headers (413)
    while the server's peak memory stays where it was; one over the count or PIL's bomb size is refused too."""
    def send(images: list) -> tuple[int, bytes]:
        return raw_request(target.port, post(target.route, json.dumps(target.body(images)).encode()))

    before = peak_rss_mib(target.pid)
    got, body = send([png(2048, 2048)] * 8)
    assert got == 413 and "--max-request-pixels" in json.loads(body)["error"]
    assert peak_rss_mib(target.pid) - before < 30  # decoding them would take 100 MB (200 MB stacked)
    got, body = send([png(8, 8)] * 9)
    assert got == 413 and "--max-batch" in json.loads(body)["error"]
    for header in (bomb_header(100_000, 100_000), bomb_header(4096, 4096)):  # PIL's bomb size, then ours
        got, body = send([header])
        assert got == 413, body
    got, body = send([png(16, 16)] * 2)
    assert got == 200, body


def test_a_detector_fault_is_a_500_json_answer_and_the_client_retries_only_that(detector_service):
    port = detector_service.port
    faulty = png(16, 16, 13)  # the probe's injected fault: detect raises
    got, body = raw_request(port, post("/detect", json.dumps({"images": [faulty]}).encode()))
    assert got == 500 and "injected detector fault" in json.loads(body)["error"]
    reward = build_reward({"model": "geneval", "url": f"http://127.0.0.1:{port}", "max_retries": 1})
    two_cats = {"tag": "counting", "include": [{"class": "cat", "count": 2}]}
    images = np.stack([np.full((16, 16, 3), 13, np.uint8), np.zeros((16, 16, 3), np.uint8)])
    out = reward(images, ["two cats"] * 2, metadata=[two_cats] * 2)  # batch_size 16: one request, which fails
    assert out.errors == 2
    assert "failed after 2 attempt(s): HTTP 500: the detector failed: RuntimeError: injected" in out.failure
    out = build_reward({"model": "geneval", "url": f"http://127.0.0.1:{port}", "max_retries": 0})(
        images[1:], ["two cats"], metadata=[two_cats])
    assert out.avg.tolist() == [1.0] and out.errors == 0


def test_a_4xx_answer_is_not_retried():
    statuses = [400, 401, 404, 408, 411, 413, 415]
    with StubServer(lambda _body: (statuses[0], json.dumps({"error": f"refused with {statuses[0]}"}).encode())) as stub:
        while statuses:
            reward = build_reward({"model": "remote", "url": stub.url, "max_retries": 3, "required": False})
            out = reward(np.zeros((1, 8, 8, 3), np.uint8), ["x"])
            assert stub.requests == 1 and out.errors == 1, statuses[0]
            stub.requests = 0
            statuses.pop(0)


class CrashingReward(ImageStatsReward):
    """image_stats whose scoring raises: a fault of the server itself."""

    def score(self, image: np.ndarray) -> float:
        raise RuntimeError("engine crashed")


@contextmanager
def app_server(app: web.Application) -> Iterator[str]:
    """``app`` served by aiohttp on 127.0.0.1 from a thread of this process; yields its URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_a_reward_that_raises_is_a_500_json_answer_which_the_client_retries():
    reward = CrashingReward(RewardConfig(model="image_stats"))
    with app_server(build_app(reward, Limits())) as url:
        body = {"prompts": ["x"], "images": [png(8, 8)]}
        answer = requests.post(f"{url}/score", json=body, timeout=30)
        assert answer.status_code == 500
        assert answer.json()["error"] == "the server failed: RuntimeError: engine crashed"
        out = build_reward({"model": "remote", "url": url, "max_retries": 1})(np.zeros((1, 8, 8, 3), np.uint8), ["x"])
    assert "failed after 2 attempt(s): HTTP 500: the server failed: RuntimeError: engine crashed" in out.failure


def textured_video(seed: int, frames: int, size: int = 32) -> np.ndarray:
    """uint8 ``[frames, size, size, 3]``: noise with a flat band that grows with the frame (image_stats differs)."""
    video = np.random.default_rng(seed).integers(0, 256, (frames, size, size, 3), dtype=np.uint8)
    for f in range(frames):
        video[f, : size * f // (frames - 1)] = 90
    return video


def test_a_video_longer_than_the_servers_max_batch_is_split_and_scored(reward_service):
    """--max-batch 8 and a 10-frame video: the client reads the limit from /health, sends the frames in pieces
    of 8 and 2, and the chunked scores equal the local reward's."""
    url = f"http://127.0.0.1:{reward_service.port}"
    videos = np.stack([textured_video(0, 10), textured_video(1, 10)])
    expected = build_reward({"model": "image_stats"})(videos, ["a", "b"])
    assert len(set(expected.extra["frame_scores"][0].tolist())) == 3  # the frames score 1, 0.44 and 0
    scored = requests.get(f"{url}/health", timeout=10).json()["images_scored"]
    out = build_reward({"model": "remote", "url": url, "max_retries": 0})(videos, ["a", "b"])
    assert out.failure == "" and "reward service unavailable" not in out.extra["error_reasons"]
    np.testing.assert_array_equal(out.extra["error_mask"], expected.extra["error_mask"])  # flat frames: 0, counted
    np.testing.assert_array_equal(out.extra["frame_scores"], expected.extra["frame_scores"])
    np.testing.assert_array_equal(out.avg, expected.avg)
    assert requests.get(f"{url}/health", timeout=10).json()["images_scored"] == scored + 20
    # 256² frames: a 1 MiB body holds 3 of them at the most their PNGs can take, fewer than --max-batch; 3 and 3
    videos = np.stack([textured_video(2, 6, 256), textured_video(3, 6, 256)])
    expected = build_reward({"model": "image_stats"})(videos, ["a", "b"])
    out = build_reward({"model": "remote", "url": url, "max_retries": 0})(videos, ["a", "b"])
    assert out.failure == "" and "reward service unavailable" not in out.extra["error_reasons"]
    np.testing.assert_array_equal(out.extra["error_mask"], expected.extra["error_mask"])  # flat frames: 0, counted
    np.testing.assert_array_equal(out.extra["frame_scores"], expected.extra["frame_scores"])

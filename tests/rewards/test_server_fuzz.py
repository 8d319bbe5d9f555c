"""A bounded HTTP fuzz of both servers on 127.0.0.1 (the reward server and the GenEval detector server, each in a
process of its own, tests/rewards/conftest.py): ``REQUESTS`` requests per server from a fixed seed, malformed HTTP,
broken JSON, truncated, oversized and well-formed-but-hostile bodies (pixel bombs, odd image modes and formats),
mixed with valid requests. Asserted: every request is answered (no dropped connection) with JSON, no 5xx but the
detector's injected faults, every valid request scored, the server's peak memory (VmHWM) under RSS_BOUND_MIB above
its peak at start, and a valid request still scored at the end. The counts are printed
(docs/security.md "Fuzz campaign")."""

from __future__ import annotations

import base64
import io
import json
import random
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from PIL import Image
from service_helpers import SERVER_LIMITS, Server, peak_rss_mib, raw_request

SEED = 34
REQUESTS = 500  # per server
#: Peak memory the campaign may add to a server (MiB): its limits allow 2 requests of 1 MiB bodies and 2**20 pixels
#: (3 MiB decoded) at once; one pixel bomb decoded would take 100 MiB and more.
RSS_BOUND_MIB = 64
FAULT = (13, 13, 13)  # tests/helpers/detector_probe.py: an image starting with this pixel makes detect raise


def encode(image: Image.Image, fmt: str = "PNG", **options) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return base64.b64encode(buffer.getvalue()).decode()


def noise(rng: random.Random, size: int) -> np.ndarray:
    return np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (size, size, 3), dtype=np.uint8)


def valid_image(rng: random.Random) -> str:
    return encode(Image.fromarray(noise(rng, rng.choice([8, 16, 24, 48]))))


def png_header(width: int, height: int) -> str:
    """A PNG that is only a header claiming ``width`` x ``height``."""
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")).decode()


SOLID_2048 = encode(Image.new("RGB", (2048, 2048)))  # 4 M pixels in a few kB: over the limit per image
SOLID_1024 = encode(Image.new("RGB", (1024, 1024)))  # within it; 2 of them are over the limit per request


def hostile_image(rng: random.Random) -> object:
    """An ``images`` entry a hostile client might send."""
    small = Image.fromarray(noise(rng, 16))
    valid = valid_image(rng)
    raw = bytearray(base64.b64decode(valid))
    for _ in range(rng.randint(1, 6)):
        raw[rng.randrange(len(raw))] = rng.randrange(256)
    choices: list[Callable[[], object]] = [
        lambda: png_header(rng.choice([100_000, 2**16, 4097, 30_000]), rng.choice([100_000, 2**16, 4097, 1])),
        lambda: SOLID_2048,
        lambda: encode(small, rng.choice(["GIF", "BMP", "TIFF", "WEBP", "ICO"])),
        lambda: encode(small.convert(rng.choice(["L", "P", "RGBA", "1", "I;16", "LA"]))),
        lambda: encode(small.convert("CMYK"), "JPEG"),
        lambda: encode(small, "JPEG", progressive=True, quality=rng.randint(1, 100)),
        lambda: valid[: rng.randrange(len(valid))],
        lambda: base64.b64encode(bytes(raw)).decode(),
        lambda: "data:image/png;base64," + valid,
        lambda: valid[:40] + "\n" + valid[40:],
        lambda: rng.choice(["", "%%%", "=" * 8, None, 7, 1e308, True, [], {}, [[valid]], {"b64": valid}]),
        lambda: base64.b64encode(rng.randbytes(rng.randint(0, 300))).decode(),
    ]
    return rng.choice(choices)()


def http(method: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    headers = {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Length": str(len(body)),
               **(headers or {})}
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if v is not None)
    return f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + body


def case(server: Server, rng: random.Random) -> tuple[str, bytes, bool]:
    """One fuzz request: ``(kind, bytes, injected fault)``; the kinds' shares are set by the weights below."""
    kind = rng.choices(["valid", "hostile body", "broken JSON", "malformed HTTP", "oversized", "truncated"],
                       [20, 30, 15, 25, 9, 1])[0]
    count = rng.randint(1, SERVER_LIMITS.max_images // 2)
    video = server.kind == "reward" and rng.random() < 0.3
    images: list = [[valid_image(rng) for _ in range(2)] if video else valid_image(rng) for _ in range(count)]
    fault = False
    if kind == "valid" and server.kind == "detector" and rng.random() < 0.2:
        images[0] = encode(Image.new("RGB", (8, 8), FAULT))
        fault = True
    body = server.body(images, [rng.choice(["a cat", "ü\u2028\x00", "x" * 10_000, ""]) for _ in images])
    if kind == "hostile body":
        mutation = rng.randrange(6)
        if mutation < 3:
            body["images"][rng.randrange(count)] = hostile_image(rng)
        elif mutation == 3:
            body["images"] = rng.choice([[valid_image(rng)] * rng.randint(SERVER_LIMITS.max_images + 1, 64),
                                         [SOLID_1024] * rng.randint(2, SERVER_LIMITS.max_images)])
            if "prompts" in body:
                body["prompts"] = ["a cat"] * len(body["images"])
        elif mutation == 4 and "prompts" in body:
            body["prompts"] = rng.choice([body["prompts"][:-1], [None] * count, "a cat", [["x"]] * count])
        else:
            body = rng.choice([[], "images", None, {"images": None}, {"images": {"0": valid_image(rng)}}])
    data = json.dumps(body).encode()
    if kind == "broken JSON":
        data = rng.choice([
            lambda: data[: rng.randrange(len(data))],
            lambda: bytes(b ^ 0xFF if rng.random() < 0.01 else b for b in data),
            lambda: b"[" * rng.randint(1000, 200_000) + b"]" * rng.randint(0, 10),
            lambda: b'{"images": [1e999999, NaN, -Infinity], "prompts": [' + b"9" * 5000 + b"]}",
            lambda: b"\xff\xfe\x00" + data,
            lambda: data.replace(b'"', b"'"),
        ])()
    if kind == "malformed HTTP":
        return kind, malformed_http(server, rng, data), False
    if kind == "oversized":
        length = rng.choice([SERVER_LIMITS.max_request_bytes + 1, 10**12, 2**63])
        padding = b" " * (SERVER_LIMITS.max_request_bytes + 10) if rng.random() < 0.3 else data
        return kind, http("POST", server.route, padding, {"Content-Length": str(length)}), False
    if kind == "truncated":
        return kind, http("POST", server.route, data[: len(data) // 2], {"Content-Length": str(len(data))}), False
    return kind, http("POST", server.route, data), fault


def malformed_http(server: Server, rng: random.Random, data: bytes) -> bytes:
    route = server.route
    variants: list[Callable[[], bytes]] = [
        lambda: http("POST", route, data, {"Content-Length": rng.choice(["-1", "abc", "1e3", "+5", "0x10", " ", ""])}),
        lambda: http("POST", route, data, {"Content-Length": None}),
        lambda: http("POST", route, data, {"Content-Length": None, "Transfer-Encoding": "chunked"}),
        lambda: http("POST", route, data, {"Content-Type": rng.choice(
            ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None,
             "application/jsonx", "application/json; charset=utf-16"])}),
        lambda: http(rng.choice(["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "FOO", "GET"]), route, data),
        lambda: http("POST", rng.choice(["/", "/score/../health", "/%00", "/x?" + "a" * 5000, "*",
                                         "/v1/chat/completions", "http://evil.example/score"]), data),
        lambda: http("POST", route, data, {"X-Long": "a" * rng.choice([9000, 70_000])}),
        lambda: http("POST", route, data, {f"X-{i}": "v" for i in range(rng.choice([150, 1000]))}),
        lambda: http("POST", route, data, {"Authorization": rng.choice(["Bearer ü", "Bearer \x7f", "x" * 8000])}),
        lambda: f"POST {route} HTTP/{rng.choice(['2.0', '1.2', 'x', '0.9'])}\r\n\r\n".encode(),
        lambda: rng.randbytes(rng.randint(1, 400)).replace(b"\r\n\r\n", b"") + b"\r\n\r\n",
        lambda: b"POST " + route.encode() + b" HTTP/1.1\r\nContent-Length: 2\r\nBad Header Line\r\n\r\n{}",
        lambda: b"POST " + route.encode() + b" HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    ]
    return rng.choice(variants)()


def check_answer(server: Server, kind: str, request: bytes, fault: bool, status: int, body: bytes) -> None:
    where = f"{server.kind} {kind}: {request[:160]!r} -> {status} {body[:160]!r}"
    assert status != 0, f"dropped connection: {where}"
    assert status < 500 or (fault and status == 500), f"server error: {where}"
    answer = json.loads(body)  # every answer is JSON
    if status >= 400:
        assert isinstance(answer["error"], str) and answer["error"], where
    if kind == "valid":
        assert status == (500 if fault else 200), where
        if status == 200:
            values = answer["rewards" if server.kind == "reward" else "detections"]
            assert len(values) == len(json.loads(request.partition(b"\r\n\r\n")[2])["images"]), where


@pytest.mark.parametrize("which", ["reward", "detector"])
def test_http_fuzz_answers_everything_and_holds_memory(which, reward_service, detector_service, capsys):
    server = reward_service if which == "reward" else detector_service
    rng = random.Random(f"{SEED}-{which}")
    tried, statuses = Counter(), Counter()
    started = time.monotonic()
    for _ in range(REQUESTS):
        kind, request, fault = case(server, rng)
        status, body = raw_request(server.port, request, timeout_s=SERVER_LIMITS.timeout_s + 20)
        check_answer(server, kind, request, fault, status, body)
        tried[kind] += 1
        statuses[status] += 1
    peak = peak_rss_mib(server.pid)
    image = base64.b64encode(base64.b64decode(valid_image(rng))).decode()
    status, body = raw_request(server.port, http("POST", server.route, json.dumps(server.body([image])).encode()))
    assert status == 200, body  # still scoring after the campaign
    with capsys.disabled():
        print(f"\nHTTP fuzz of the {which} server: {REQUESTS} requests ({dict(tried)}) in "
              f"{time.monotonic() - started:.1f} s; answers {dict(sorted(statuses.items()))}; peak RSS "
              f"{peak:.0f} MiB, {peak - server.startup_rss_mib:.0f} MiB over its {server.startup_rss_mib:.0f} MiB at "
              f"start (bound {RSS_BOUND_MIB})")
    assert peak - server.startup_rss_mib < RSS_BOUND_MIB

"""The GenEval detector server: Mask2Former boxes and CLIP colour labels over HTTP, for ``reward.model: geneval``.

A standalone script (stdlib, numpy and Pillow at import; mmdet, mmcv and open_clip when the models load), because
the official detector stack needs an older torch than rlrunner's (README.md here sets up its environment)::

    python rlrunner/rewards/geneval/detector_server.py --model-path DETECTOR_DIR --port 18085 [--token-file F]

``GET /health`` answers ``{"status": "ok"}``; ``POST /detect`` takes ``{"images": [<base64 PNG/JPEG>]}`` and answers
``{"detections": [[{"label", "box": [x0, y0, x1, y1], "score", "color"}]]}``: per image, every detection above
``--threshold`` (0.3, GenEval's lowest; the client applies 0.9 for counting prompts), at most ``--max-objects`` (16)
per class, most confident first, each with the colour GenEval's CLIP ViT-L/14 zero-shot classifier gives its crop
(the object's mask composited on a #999 background, cropped to its box). Scoring happens in the client
(``rlrunner.rewards.geneval.scoring``), so this server only sees pixels. Loopback by default; a bearer token
(``--token-file``, compared in constant time) is required for any other ``--host``.

Requests are held to ``Limits`` (``rlrunner/rewards/serving/limits.py``, the reward server's module, options and
answers): an ``application/json`` body (415) with a numeric ``Content-Length`` (411 without, 400 malformed, 413
over ``--max-request-mb``), at most ``--max-batch`` images, ``--max-pixels`` per image and
``--max-request-pixels`` over all, added up from the image headers before any pixel is decoded (413); head and
body within one deadline of ``--timeout`` seconds from the connection's start, however slowly they trickle (408);
at most ``--max-connections`` open connections, one thread each (one more gets 503 with ``Retry-After``, without
a thread). A request takes one of ``MAX_ACTIVE`` slots only once its body is read and its token checked. Every
answer is JSON ``{"error": ...}`` with its status, never a dropped connection; 5xx only for the server's own
faults: 500 when ``detect`` raises, 503 when ``MAX_ACTIVE`` other requests stay in progress past ``--timeout``
or the connections are at their cap.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hmac
import importlib.util
import io
import json
import logging
import re
import socket
import sys
import threading
import time
import types
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
COLOR_TEMPLATES = ("a photo of a {c} {label}", "a photo of a {c}-colored {label}", "a photo of a {c} object")
DETECTOR = "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco"
IMAGE_FORMATS = ("PNG", "JPEG")
#: Requests decoded or detected at once, each taking its slot once its body is read (the rest wait up to the
#: timeout, then get 503): bounds the pixels in memory.
MAX_ACTIVE = 4
logger = logging.getLogger("geneval.detector_server")


def _load_limits() -> types.ModuleType:
    """``rlrunner/rewards/serving/limits.py`` loaded from its file: this script runs where rlrunner (and its torch)
    cannot be imported, and the module is standard library only."""
    name = "rlrunner_serving_limits"
    if name not in sys.modules:  # registered before it runs: its dataclasses look their module up
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "serving/limits.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


limits_module = _load_limits()
Limits, Deadline, Slots, ConnectionCap = (limits_module.Limits, limits_module.Deadline, limits_module.Slots,
                                          limits_module.ConnectionCap)  # Limits: also what callers pass make_server
#: This server's limits unless given: the reward server's, with fewer images per request (one GPU batch).
DEFAULT_LIMITS = Limits(max_images=64)


class Refused(Exception):
    """A request answered with ``status`` (4xx) and the one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

Detect = Callable[[list[np.ndarray]], list[list[dict[str, Any]]]]


class Mask2FormerDetector:
    """GenEval's detector (Mask2Former Swin-S, COCO) and colour classifier (open_clip ViT-L-14, OpenAI weights)."""

    def __init__(self, model_path: str, config: str, device: str, threshold: float, max_objects: int) -> None:
        import mmdet
        import open_clip
        import torch
        from mmdet.apis import init_detector

        config = config or str(Path(mmdet.__file__).parent / f"../configs/mask2former/{DETECTOR}.py")
        checkpoint = Path(model_path) / f"{DETECTOR}.pth"
        if not checkpoint.is_file():
            raise FileNotFoundError(f"--model-path {model_path} has no {checkpoint.name}; download it with GenEval's "
                                    f"evaluation/download_models.sh (README.md here)")
        self.torch, self.device = torch, device
        self.detector = init_detector(config, str(checkpoint), device=device)
        self.classes = list(self.detector.CLASSES)
        self.clip, _, self.transform = open_clip.create_model_and_transforms("ViT-L-14", pretrained="openai",
                                                                             device=device)
        self.tokenizer = open_clip.get_tokenizer("ViT-L-14")
        self.threshold, self.max_objects = threshold, max_objects
        self.color_weights: dict[str, Any] = {}
        self.lock = threading.Lock()  # one GPU model: requests take turns

    def __call__(self, images: list[np.ndarray]) -> list[list[dict[str, Any]]]:
        from mmdet.apis import inference_detector

        with self.lock, self.torch.no_grad():
            # BGR, as mmcv reads the image files of the official evaluation
            results = inference_detector(self.detector, [np.ascontiguousarray(im[..., ::-1]) for im in images])
            return [self._objects(image, result) for image, result in zip(images, results)]

    def _objects(self, image: np.ndarray, result: Any) -> list[dict[str, Any]]:
        boxes, masks = result if isinstance(result, tuple) else (result, None)
        found = []
        for index, label in enumerate(self.classes):
            order = np.argsort(boxes[index][:, 4])[::-1]
            order = order[boxes[index][order, 4] > self.threshold][: self.max_objects]
            for k in order:
                mask = None if masks is None else np.asarray(masks[index][k])
                found.append((label, boxes[index][k], mask))
        colors = self._colors(image, found)
        return [{"label": label, "box": [float(v) for v in box[:4]], "score": float(box[4]), "color": color}
                for (label, box, _), color in zip(found, colors)]

    def _colors(self, image: np.ndarray, found: list[tuple[str, np.ndarray, np.ndarray | None]]) -> list[str]:
        picture, gray = Image.fromarray(image), Image.new("RGB", (image.shape[1], image.shape[0]), "#999")
        colors = []
        for label, box, mask in found:
            crop = picture if mask is None else Image.composite(picture, gray, Image.fromarray(mask))
            pixels = self.transform(crop.crop(tuple(float(v) for v in box[:4]))).unsqueeze(0).to(self.device)
            features = self.clip.encode_image(pixels)
            features = features / features.norm(dim=-1, keepdim=True)
            colors.append(COLORS[int((features @ self._color_weights(label)).argmax())])
        return colors

    def _color_weights(self, label: str) -> Any:
        """clip_benchmark's zero-shot classifier: per colour, the normalised mean of its normalised template
        embeddings; ``[D, len(COLORS)]``."""
        if label not in self.color_weights:
            columns = []
            for c in COLORS:
                tokens = self.tokenizer([t.format(c=c, label=label) for t in COLOR_TEMPLATES]).to(self.device)
                text = self.clip.encode_text(tokens)
                mean = (text / text.norm(dim=-1, keepdim=True)).mean(dim=0)
                columns.append(mean / mean.norm())
            self.color_weights[label] = self.torch.stack(columns, dim=1)
        return self.color_weights[label]


def open_image(text: Any, max_pixels: int) -> Image.Image:
    """base64 PNG/JPEG -> a PIL image with its header checked and no pixel decoded yet (PIL decodes lazily)
    (``rlrunner.rewards.serving.wire.open_image``'s job, repeated here because this script cannot import rlrunner
    in the detector's environment)."""
    if not isinstance(text, str):
        raise Refused(400, f"each image must be a base64 string, got {type(text).__name__}")
    try:
        image = Image.open(io.BytesIO(base64.b64decode(text, validate=True)), formats=IMAGE_FORMATS)
    except Image.DecompressionBombError as err:
        raise Refused(413, f"an image is over PIL's decompression-bomb size ({err})") from None
    except (binascii.Error, ValueError, OSError, SyntaxError) as err:
        raise Refused(400, f"an image is not base64 PNG/JPEG ({err})") from None
    if image.size[0] * image.size[1] > max_pixels:
        raise Refused(413, f"an image of {image.size[0]}x{image.size[1]} pixels is over the limit of {max_pixels} "
                           f"(--max-pixels)")
    return image


def decode_images(body: Any, limits: Limits) -> list[np.ndarray]:
    """uint8 RGB ``[H, W, 3]`` per image of a ``/detect`` body; count and pixels checked before any decode."""
    if not isinstance(body, dict) or not isinstance(body.get("images"), list):
        raise Refused(400, "expected a JSON object with an 'images' list")
    if len(body["images"]) > limits.max_images:
        raise Refused(413, f"{len(body['images'])} images is over the limit of {limits.max_images} (--max-batch)")
    opened = [open_image(text, limits.max_pixels) for text in body["images"]]
    total = sum(image.size[0] * image.size[1] for image in opened)
    if total > limits.max_request_pixels:
        raise Refused(413, f"the images hold {total} pixels, over the limit of {limits.max_request_pixels} per "
                           f"request (--max-request-pixels)")
    arrays = []
    for image in opened:
        try:
            arrays.append(np.asarray(image.convert("RGB")))
        except (ValueError, OSError, SyntaxError, EOFError) as err:
            raise Refused(400, f"an image cannot be decoded ({err})") from None
        finally:
            image.close()
    return arrays


def make_server(detect: Detect, host: str, port: int, token: str = "",
                limits: Limits = DEFAULT_LIMITS) -> ThreadingHTTPServer:
    """An HTTP server answering ``/health`` and ``/detect`` with ``detect`` (not started)."""
    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        raise ValueError(f"--host {host} is reachable from other machines; give a bearer token with --token-file")
    expected = f"Bearer {token}".encode()
    slots = Slots(MAX_ACTIVE)

    class Handler(BaseHTTPRequestHandler):
        default_request_version = "HTTP/1.0"  # not 0.9, whose answers have no status line: garbage gets a real 400
        unread = False  # a body is left on the socket (answered before reading it)
        answered = False

        def setup(self) -> None:
            super().setup()
            self.rfile.close()  # the stdlib's reader, replaced by one that holds every read to the deadline
            self.reader = limits_module.DeadlineReader(self.connection)
            self.rfile = io.BufferedReader(self.reader)

        def handle_one_request(self) -> None:
            self.reader.deadline, self.answered = Deadline.after(limits.timeout_s), False
            super().handle_one_request()  # a head past the deadline ends it without an answer: answered here
            if self.reader.late and not self.answered and self.reader.received:
                self.unread = True
                self._write(limits_module.raw_answer(408, limits_module.late_message(limits)))

        def do_GET(self) -> None:
            if not self._authorised():
                return
            if self.path != "/health":
                return self._reply(404, {"error": f"no route {self.path}; GET /health"})
            self._reply(200, {"status": "ok", "limits": limits.__dict__})

        def do_POST(self) -> None:
            self.unread = True
            if not self._authorised():
                return
            if self.path != "/detect":
                return self._reply(404, {"error": f"no route {self.path}; POST /detect"})
            try:
                body = self._read_json()
                with slots.held(limits.timeout_s):  # only now: a slow body holds its connection, never a slot
                    self._detect(body)
            except Refused as err:
                self._reply(err.status, {"error": str(err)})
            except limits_module.Busy as err:
                self._reply(503, {"error": str(err)})

        def _detect(self, body: Any) -> None:
            images = decode_images(body, limits)
            try:
                answer = json.dumps({"detections": detect(images)}).encode()
            except Exception as err:  # the detector failed: a fault of this server, which clients may retry
                logger.exception("detect failed")
                return self._reply(500, {"error": f"the detector failed: {type(err).__name__}: {err}"[:300]})
            self._send(200, answer)

        def _read_json(self) -> Any:
            if self.headers.get_content_type() != "application/json":
                raise Refused(415, f"send Content-Type: application/json, not {self.headers.get_content_type()!r}")
            lengths = set(self.headers.get_all("Content-Length") or [])
            if not lengths:
                raise Refused(411, "send a Content-Length (chunked bodies are not read)")
            text = lengths.pop().strip()
            if lengths or not re.fullmatch(r"[0-9]{1,19}", text):
                raise Refused(400, f"Content-Length {text!r} is not one non-negative integer")
            length = int(text)
            if length > limits.max_request_bytes:
                raise Refused(413, f"a body of {length} bytes is over the limit of {limits.max_request_bytes} "
                                   f"(--max-request-mb)")
            try:
                data = self.rfile.read(length)
            except TimeoutError:
                raise Refused(408, limits_module.late_message(limits)) from None
            self.unread = False
            if len(data) < length:
                raise Refused(400, f"the body ended after {len(data)} of its {length} bytes")
            try:
                return json.loads(data)
            except (ValueError, UnicodeDecodeError) as err:
                raise Refused(400, f"the body is not JSON ({err})") from None
            except RecursionError:
                raise Refused(400, "the body is JSON nested too deeply to read") from None

        def _authorised(self) -> bool:
            given = (self.headers.get("Authorization") or "").encode("utf-8", "surrogateescape")
            if token and not hmac.compare_digest(given, expected):  # constant time: no prefix can be guessed
                self._reply(401, {"error": "missing or wrong bearer token"})
                return False
            return True

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            """The stdlib's answers to requests it cannot parse, as JSON; what it calls 5xx there is the client's
            doing (an unknown method: 405 here, not 501; an HTTP version it does not speak: 400, not 505)."""
            code = {HTTPStatus.NOT_IMPLEMENTED: HTTPStatus.METHOD_NOT_ALLOWED,
                    HTTPStatus.HTTP_VERSION_NOT_SUPPORTED: HTTPStatus.BAD_REQUEST}.get(code, code)
            self.close_connection = True
            self._reply(code, {"error": message or HTTPStatus(code).phrase})

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            self._send(status, json.dumps(payload).encode())

        def _send(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self._write(data)

        def _write(self, data: bytes) -> None:
            self.answered = True
            self.connection.settimeout(limits.timeout_s)  # the reads' deadline is spent; each write gets the timeout
            self.wfile.write(data)

        def finish(self) -> None:
            super().finish()
            if self.unread:
                _linger(self.connection)

        def log_message(self, *args: object) -> None:
            pass

    return limits_module.CappedThreadingServer((host, port), Handler, ConnectionCap(limits.max_connections))


def _linger(connection: socket.socket) -> None:
    """Close our side, then read and drop what the client still sends for up to LINGER_S (a lingering close)."""
    try:
        connection.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + limits_module.LINGER_S
        while (left := deadline - time.monotonic()) > 0:
            connection.settimeout(left)
            if not connection.recv(2**16):
                return
    except OSError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True, help=f"folder holding {DETECTOR}.pth")
    parser.add_argument("--config", default="", help="mmdet config (default: mmdet's own for the checkpoint)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18085)
    parser.add_argument("--token-file", default="", help="file holding the bearer token clients must send")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--threshold", type=float, default=0.3)
    parser.add_argument("--max-objects", type=int, default=16)
    limits_module.add_limit_options(parser, DEFAULT_LIMITS)
    args = parser.parse_args()
    token = Path(args.token_file).read_text().strip() if args.token_file else ""
    try:
        limits = limits_module.limits_from_options(args)
    except ValueError as err:
        parser.error(str(err))
    detector = Mask2FormerDetector(args.model_path, args.config, args.device, args.threshold, args.max_objects)
    server = make_server(detector, args.host, args.port, token, limits)
    print(f"GenEval detector on http://{args.host}:{args.port} ({args.device})", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()

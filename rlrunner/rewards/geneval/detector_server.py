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
(``--token-file``) is required for any other ``--host``.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
COLOR_TEMPLATES = ("a photo of a {c} {label}", "a photo of a {c}-colored {label}", "a photo of a {c} object")
DETECTOR = "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco"
MAX_BODY_BYTES = 256 * 2**20

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


def decode(text: Any) -> np.ndarray:
    """base64 PNG/JPEG -> uint8 RGB ``[H, W, 3]`` (``rlrunner.rewards.serving.wire.decode_image``'s job, repeated here
    because this script cannot import rlrunner in the detector's environment)."""
    if not isinstance(text, str):
        raise TypeError(f"each image must be a base64 string, got {type(text).__name__}")
    try:
        return np.asarray(Image.open(io.BytesIO(base64.b64decode(text, validate=True))).convert("RGB"))
    except (ValueError, OSError) as err:
        raise ValueError(f"an image is not base64 PNG/JPEG ({err})") from None


def make_server(detect: Detect, host: str, port: int, token: str = "") -> ThreadingHTTPServer:
    """An HTTP server answering ``/health`` and ``/detect`` with ``detect`` (not started)."""
    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        raise ValueError(f"--host {host} is reachable from other machines; give a bearer token with --token-file")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if not self._authorised():
                return
            if self.path != "/health":
                return self._reply(404, {"error": f"no route {self.path}; GET /health"})
            self._reply(200, {"status": "ok"})

        def do_POST(self) -> None:
            if not self._authorised():
                return
            if self.path != "/detect":
                return self._reply(404, {"error": f"no route {self.path}; POST /detect"})
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                return self._reply(413, {"error": f"request of {length} bytes is over {MAX_BODY_BYTES}"})
            try:
                body = json.loads(self.rfile.read(length))
                if not isinstance(body, dict) or not isinstance(body.get("images"), list):
                    raise TypeError("expected a JSON object with an 'images' list")
                images = [decode(im) for im in body["images"]]
            except (ValueError, TypeError) as err:
                return self._reply(400, {"error": str(err)})
            self._reply(200, {"detections": detect(images)})

        def _authorised(self) -> bool:
            if token and self.headers.get("Authorization") != f"Bearer {token}":
                self._reply(401, {"error": "missing or wrong bearer token"})
                return False
            return True

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return ThreadingHTTPServer((host, port), Handler)


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
    args = parser.parse_args()
    token = Path(args.token_file).read_text().strip() if args.token_file else ""
    detector = Mask2FormerDetector(args.model_path, args.config, args.device, args.threshold, args.max_objects)
    server = make_server(detector, args.host, args.port, token)
    print(f"GenEval detector on http://{args.host}:{args.port} ({args.device})", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()

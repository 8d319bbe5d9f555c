"""The reward server's HTTP application (aiohttp): ``/score``, ``/health`` and an OpenAI-style OCR "model".

    GET  /health                 {"status": "ok", "reward": name, "images_scored": n, "max_images": ..., ...}
    POST /score                  wire.py's format: scores with the served reward
    GET  /v1/models              the one model name this server answers to
    POST /v1/chat/completions    reads the text in the message's images with the served OCR reward's engine

Every route needs ``Authorization: Bearer <token>`` when the server has a token (compared in constant time).
Bodies are JSON; nothing is unpickled. Oversized requests get 413, malformed ones 400, each with a JSON
``{"error": "..."}`` line. Scoring runs on ``workers`` threads (OCR engines release the GIL), so the event loop
keeps answering while images are scored.

Built by ``python -m rlrunner.serve_reward``; aiohttp is imported only here.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web

from ..ocr.reward import OcrReward
from ..registry import Reward
from .wire import MalformedMessage, TooLarge, data_url_payload, decode_image

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Limits:
    """What one request may carry: ``max_request_bytes`` of body, ``max_images`` images (video frames count),
    ``max_pixels`` pixels per image."""

    max_request_bytes: int = 64 * 2**20
    max_images: int = 256
    max_pixels: int = 4096 * 4096


def build_app(reward: Reward, limits: Limits, workers: int = 1, token: str = "",
              served_model: str = "rlrunner-ocr") -> web.Application:
    """The aiohttp application serving ``reward``; ``token`` empty = no authentication (loopback only)."""
    app = web.Application(client_max_size=limits.max_request_bytes, middlewares=[_json_errors, _bearer(token)])
    service = RewardService(reward, limits, workers, served_model)
    app.router.add_get("/health", service.health)
    app.router.add_post("/score", service.score)
    app.router.add_get("/v1/models", service.models)
    app.router.add_post("/v1/chat/completions", service.chat)
    app.on_cleanup.append(service.close)
    return app


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every HTTP error as ``{"error": "<one line>"}`` with its status (aiohttp's 413 included)."""
    try:
        return await handler(request)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        return web.json_response({"error": err.text or err.reason}, status=err.status, headers=_auth_header(err))


def _auth_header(err: web.HTTPException) -> dict[str, str]:
    value = err.headers.get("WWW-Authenticate")
    return {"WWW-Authenticate": value} if value else {}


def _bearer(token: str) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode()
        if token and not hmac.compare_digest(given, expected):  # constant time: no token prefix can be guessed
            raise web.HTTPUnauthorized(text="missing or wrong bearer token (Authorization: Bearer <token>)",
                                       headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return check


class RewardService:
    """The route handlers around one reward; CPU work runs on a pool of ``workers`` threads."""

    def __init__(self, reward: Reward, limits: Limits, workers: int, served_model: str) -> None:
        self.reward, self.limits, self.served_model = reward, limits, served_model
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="score")
        self.images_scored = 0  # reported by /health: lets an operator (and the tests) see what was scored

    async def close(self, _app: web.Application) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "reward": self.reward.spec.model, "engine": self.reward.spec.engine,
                                  "max_images": self.limits.max_images, "max_request_bytes": self.limits.max_request_bytes,
                                  "images_scored": self.images_scored})

    async def score(self, request: web.Request) -> web.Response:
        body = await _read_json(request)
        prompts, images = _score_request(body, self.limits.max_images)
        answer = await self._run(self._score, prompts, images)
        self.images_scored += sum(len(e) if isinstance(e, list) else 1 for e in images)
        return web.json_response(answer)

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.served_model, "object": "model",
                                                              "owned_by": "rlrunner"}]})

    async def chat(self, request: web.Request) -> web.Response:
        if not isinstance(self.reward, OcrReward):
            raise web.HTTPNotFound(text=f"this server's reward ({self.reward.spec.model}) reads no text; start it "
                                        f"with --reward ocr to serve chat completions")
        body = await _read_json(request)
        images = _chat_images(body)
        if len(images) > self.limits.max_images:
            raise web.HTTPRequestEntityTooLarge(self.limits.max_images, len(images),
                                                text=f"{len(images)} images is over the limit of "
                                                     f"{self.limits.max_images} (--max-batch)")
        text = await self._run(self._read_text, images)
        return web.json_response({
            "id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or self.served_model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        })

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the scoring threads; bad images become 400/413 with the message naming the image."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        except TooLarge as err:
            raise web.HTTPRequestEntityTooLarge(self.limits.max_pixels, 0, text=str(err)) from None
        except MalformedMessage as err:
            raise web.HTTPBadRequest(text=str(err)) from None

    def _score(self, prompts: list[str], images: list[str | list[str]]) -> dict[str, Any]:
        """Decode and score; a video's frames are scored as images and come back as lists."""
        flat, owners = [], []
        for b, entry in enumerate(images):
            for f, text in enumerate(entry if isinstance(entry, list) else [entry]):
                name = f"images[{b}][{f}]" if isinstance(entry, list) else f"images[{b}]"
                flat.append(_decode(text, name, self.limits.max_pixels))
                owners.append(b)
        scores = np.zeros(len(flat), dtype=np.float32)
        errors: list[str | None] = [None] * len(flat)
        parts: dict[str, np.ndarray] = {}
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, image in enumerate(flat):  # the reward takes one array: score each image size on its own
            by_shape.setdefault(image.shape, []).append(i)
        for index in by_shape.values():
            out = self.reward(np.stack([flat[i] for i in index]), [prompts[owners[i]] for i in index])
            scores[index] = out.avg
            mask = out.extra.get("error_mask", np.zeros(len(index), dtype=bool))
            reasons = out.extra.get("image_errors") or [f"scored 0 by {self.reward.spec.model}" if m else None
                                                        for m in mask]
            for i, reason in zip(index, reasons):
                errors[i] = reason
            for name, values in out.parts.items():
                parts.setdefault(name, np.zeros(len(flat), dtype=np.float32))[index] = values
        return {"rewards": _regroup(scores.tolist(), images), "errors": _regroup(errors, images),
                "parts": {name: _regroup(values.tolist(), images) for name, values in parts.items()}}

    def _read_text(self, images: list[str]) -> str:
        """The OCR reward's recognised text of each image (after its alphabet filter), one line per image."""
        texts = []
        for i, text in enumerate(images):
            image = _decode(text, f"image_url {i}", self.limits.max_pixels)
            # the prompt only feeds the score, which a reader does not need; any non-empty target will do
            _, read, _ = self.reward.score_images(image[None], ["text"], [None])  # type: ignore[attr-defined]
            texts.append(read[0])
        return "\n".join(texts)


def _decode(text: str, name: str, max_pixels: int) -> np.ndarray:
    try:
        return decode_image(text, max_pixels)
    except TooLarge as err:
        raise TooLarge(f"{name}: {err}") from None
    except MalformedMessage as err:
        raise MalformedMessage(f"{name}: {err}") from None


def _regroup(values: list[Any], images: list[str | list[str]]) -> list[Any]:
    """Flat per-image values back to one value per image, or one list per video."""
    out, start = [], 0
    for entry in images:
        if isinstance(entry, list):
            out.append(values[start:start + len(entry)])
            start += len(entry)
        else:
            out.append(values[start])
            start += 1
    return out


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()  # aiohttp answers 413 past client_max_size
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise web.HTTPBadRequest(text=f"the body is not JSON ({err})") from None


def _score_request(body: Any, max_images: int) -> tuple[list[str], list[str | list[str]]]:
    """Check a ``/score`` body's shape (400) and size (413) before any image is decoded."""
    if not isinstance(body, dict) or not isinstance(body.get("prompts"), list) or not isinstance(
            body.get("images"), list):
        raise web.HTTPBadRequest(text='expected {"prompts": [str, ...], "images": [base64 PNG/JPEG or a list of '
                                      'them per video, ...]}')
    prompts, images = body["prompts"], body["images"]
    if len(prompts) != len(images):
        raise web.HTTPBadRequest(text=f"got {len(prompts)} prompts for {len(images)} images")
    if not all(isinstance(p, str) for p in prompts):
        raise web.HTTPBadRequest(text="every prompt must be a string")
    if not all(isinstance(e, str) or (isinstance(e, list) and e and all(isinstance(f, str) for f in e))
               for e in images):
        raise web.HTTPBadRequest(text="each entry of images must be a base64 string or a non-empty list of them")
    count = sum(len(e) if isinstance(e, list) else 1 for e in images)
    if count > max_images:
        raise web.HTTPRequestEntityTooLarge(max_images, count, text=f"{count} images (video frames count) is over "
                                                                     f"the server's limit of {max_images} (--max-batch)")
    return prompts, images


def _chat_images(body: Any) -> list[str]:
    """The base64 payloads of the ``image_url`` parts of a chat request's messages (400 if there are none)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        raise web.HTTPBadRequest(text='expected {"model": ..., "messages": [...]}')
    images = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = part.get("image_url")
                try:
                    images.append(data_url_payload(url.get("url") if isinstance(url, dict) else url))
                except MalformedMessage as err:
                    raise web.HTTPBadRequest(text=str(err)) from None
    if not images:
        raise web.HTTPBadRequest(text="no image_url part in the messages: this server only reads text in images")
    return images

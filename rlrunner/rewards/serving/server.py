"""The reward server's HTTP application (aiohttp): ``/score``, ``/health`` and an OpenAI-style OCR "model".

    GET  /health                 {"status": "ok", "reward": name, "images_scored": n, "limits": {...}}
    POST /score                  wire.py's format: scores with the served reward
    GET  /v1/models              the one model name this server answers to
    POST /v1/chat/completions    reads the text in the message's images with the served OCR reward's engine

Every route needs ``Authorization: Bearer <token>`` when the server has a token (compared in constant time).
Bodies are ``application/json`` (415 otherwise: a browser page cannot post a CORS-simple ``text/plain`` body) with a
``Content-Length`` (411 without; a malformed one 400); nothing is unpickled. Every failure is answered, never a
dropped connection, with a JSON ``{"error": "..."}`` line and its status: 400 malformed, 401 token, 408 a request
(head and body) that missed its deadline, 413 over a limit (:class:`Limits`), 415, 503 a connection over
``max_connections``, and 500 only for a fault of the server itself (its reward raised), the one answer clients
retry. The pixels of a request are added up from the image headers before any image is decoded. Scoring runs on
``workers`` threads (OCR engines release the GIL), so the event loop keeps answering while images are scored; a
request takes one of ``2 * workers`` slots only once its body is read. The deadline, slots and connection cap are
``limits.py``'s rules, which the detector server follows too.

Built by ``python -m rlrunner.commands.serve_reward``; aiohttp is imported only here and in ``transport.py`` (the
connections: deadline, cap, middlewares).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from aiohttp import web
from PIL import Image

from ..ocr.reward import OcrReward
from ..registry import Reward
from .limits import Deadline, Limits, Slots, late_message
from .transport import bearer, deadline_phase, json_errors, serve
from .wire import MalformedMessage, TooLarge, data_url_payload, image_pixels, open_image

__all__ = ["Limits", "RewardService", "build_app", "serve"]  # Limits: limits.py's, the options of both servers


def build_app(reward: Reward, limits: Limits, workers: int = 1, token: str = "",
              served_model: str = "rlrunner-ocr") -> web.Application:
    """The aiohttp application serving ``reward``; ``token`` empty = no authentication (loopback only)."""
    app = web.Application(client_max_size=limits.max_request_bytes,
                          middlewares=[deadline_phase, json_errors, bearer(token)])
    service = RewardService(reward, limits, workers, served_model)
    app.router.add_get("/health", service.health)
    app.router.add_post("/score", service.score)
    app.router.add_get("/v1/models", service.models)
    app.router.add_post("/v1/chat/completions", service.chat)
    app.on_cleanup.append(service.close)
    return app


class RewardService:
    """The route handlers around one reward; CPU work runs on a pool of ``workers`` threads."""

    def __init__(self, reward: Reward, limits: Limits, workers: int, served_model: str) -> None:
        self.reward, self.limits, self.served_model = reward, limits, served_model
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="score")
        # taken once a body is read: decoded pixels stay within 2 * workers requests' limits (bodies within the
        # connection cap's)
        self.slots = Slots(2 * workers)
        self.images_scored = 0  # reported by /health: lets an operator (and the tests) see what was scored

    async def close(self, _app: web.Application) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def health(self, _request: web.Request) -> web.Response:
        """Status and the limits, which clients read to size their requests (``remote`` splits long videos)."""
        return web.json_response({"status": "ok", "reward": self.reward.spec.model, "engine": self.reward.spec.engine,
                                  "limits": dataclasses.asdict(self.limits), "images_scored": self.images_scored})

    async def score(self, request: web.Request) -> web.Response:
        body = await _read_json(request, self.limits)
        prompts, images = _score_request(body, self.limits.max_images)
        async with self.slots.held_async(None):
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
        body = await _read_json(request, self.limits)
        images = _chat_images(body)
        if len(images) > self.limits.max_images:
            raise web.HTTPRequestEntityTooLarge(self.limits.max_images, len(images),
                                                text=f"{len(images)} images is over the limit of "
                                                     f"{self.limits.max_images} (--max-batch)")
        async with self.slots.held_async(None):
            text = await self._run(self._read_text, images)
        model = body.get("model") if isinstance(body.get("model"), str) else self.served_model
        return web.json_response({
            "id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()),
            "model": model or self.served_model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        })

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the scoring threads; bad images become 400/413 with the message naming the image."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        except TooLarge as err:
            raise web.HTTPRequestEntityTooLarge(self.limits.max_request_pixels, 0, text=str(err)) from None
        except MalformedMessage as err:
            raise web.HTTPBadRequest(text=str(err)) from None

    def _open(self, named: list[tuple[str, str]]) -> list[Image.Image]:
        """Every image's header read and checked, and their pixels added up, before any pixel is decoded."""
        opened, total = [], 0
        for name, text in named:
            image = _named(open_image, name, text, self.limits.max_pixels)
            opened.append(image)
            total += image.size[0] * image.size[1]
            if total > self.limits.max_request_pixels:
                raise TooLarge(f"the images hold over {total} pixels, over the server's limit of "
                               f"{self.limits.max_request_pixels} per request (--max-request-pixels)")
        return opened

    def _score(self, prompts: list[str], images: list[str | list[str]]) -> dict[str, Any]:
        """Decode and score; a video's frames are scored as images and come back as lists."""
        named, owners = [], []
        for b, entry in enumerate(images):
            for f, text in enumerate(entry if isinstance(entry, list) else [entry]):
                named.append((f"images[{b}][{f}]" if isinstance(entry, list) else f"images[{b}]", text))
                owners.append(b)
        opened = self._open(named)
        scores = np.zeros(len(opened), dtype=np.float32)
        errors: list[str | None] = [None] * len(opened)
        parts: dict[str, np.ndarray] = {}
        by_size: dict[tuple[int, int], list[int]] = {}
        for i, image in enumerate(opened):  # the reward takes one array: score each image size on its own
            by_size.setdefault(image.size, []).append(i)
        for (width, height), index in by_size.items():
            batch = np.empty((len(index), height, width, 3), dtype=np.uint8)  # decoded straight into it: one copy
            for k, i in enumerate(index):
                batch[k] = _named(image_pixels, named[i][0], opened[i])
            out = self.reward(batch, [prompts[owners[i]] for i in index])
            del batch
            scores[index] = out.avg
            mask = out.extra.get("error_mask", np.zeros(len(index), dtype=bool))
            reasons = out.extra.get("image_errors") or [f"scored 0 by {self.reward.spec.model}" if m else None
                                                        for m in mask]
            for i, reason in zip(index, reasons):
                errors[i] = reason
            for name, values in out.parts.items():
                parts.setdefault(name, np.zeros(len(opened), dtype=np.float32))[index] = values
        return {"rewards": _regroup(scores.tolist(), images), "errors": _regroup(errors, images),
                "parts": {name: _regroup(values.tolist(), images) for name, values in parts.items()}}

    def _read_text(self, images: list[str]) -> str:
        """The OCR reward's recognised text of each image (after its alphabet filter), one line per image."""
        names = [f"image_url {i}" for i in range(len(images))]
        texts = []
        for name, image in zip(names, self._open(list(zip(names, images)))):
            pixels = _named(image_pixels, name, image)
            # the prompt only feeds the score, which a reader does not need; any non-empty target will do
            _, read, _ = self.reward.score_images(pixels[None], ["text"], [None])  # type: ignore[attr-defined]
            texts.append(read[0])
        return "\n".join(texts)


def _named(fn: Callable[..., Any], name: str, *args: Any) -> Any:
    """``fn(*args)`` with its TooLarge or MalformedMessage message prefixed by the image's ``name``."""
    try:
        return fn(*args)
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


async def _read_json(request: web.Request, limits: Limits) -> Any:
    """The request's JSON body, its type and length checked before it is read, and read by the request's deadline
    (``timeout_s`` from when the server was ready for it, head included; from now under a plain aiohttp runner)."""
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(text=f"send Content-Type: application/json, not {request.content_type!r}")
    length = request.content_length
    if length is None:
        raise web.HTTPLengthRequired(text="send a Content-Length (chunked bodies are not read)")
    if length > limits.max_request_bytes:
        raise web.HTTPRequestEntityTooLarge(limits.max_request_bytes, length,
                                            text=f"a body of {length} bytes is over the server's limit of "
                                                 f"{limits.max_request_bytes} (--max-request-mb)")
    deadline = getattr(request.protocol, "deadline", None) or Deadline.after(limits.timeout_s)
    try:
        raw = await asyncio.wait_for(request.read(), deadline.left())
    except asyncio.TimeoutError:
        raise web.HTTPRequestTimeout(text=late_message(limits)) from None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise web.HTTPBadRequest(text=f"the body is not JSON ({err})") from None
    except RecursionError:
        raise web.HTTPBadRequest(text="the body is JSON nested too deeply to read") from None


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

"""The reward service's wire format: JSON only (nothing from the network is ever unpickled), images as base64 PNG.

``POST /score``::

    request   {"prompts": [str] * B, "images": [<image> | [<frame>] * F] * B}     # <image>: base64 PNG or JPEG
    response  {"rewards": [float | [float] * F] * B,                               # one score per image / frame
               "errors":  [null | str | [null | str] * F] * B,                     # why an image scored 0
               "parts":   {name: [float | [float] * F] * B}}

A video is a list of its frames; the server scores every frame as an image and the client groups the frame scores
into chunks (``frame_interval``), exactly as the local ``video_ocr`` reward does. A video with more frames than the
server takes in one request (the ``limits`` its ``GET /health`` states) travels as consecutive pieces of its frames,
each an entry of its own with the video's prompt.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Sequence

import numpy as np
from PIL import Image

from rlrunner.utils.numbers import is_finite_number

#: Formats a server decodes; PNG is lossless, so a served reward sees exactly the pixels the local one would.
IMAGE_FORMATS = ("PNG", "JPEG")
#: PNG compression level of encoded images: 1 is ~5x faster than the default 6 for ~10 % larger requests.
PNG_LEVEL = 1


class MalformedMessage(ValueError):
    """A request or answer that does not follow this format; the message says what was expected."""


class TooLarge(ValueError):
    """A request over one of the server's size limits (HTTP 413)."""


def encode_image(image: np.ndarray) -> str:
    """uint8 ``[H, W, 3]`` -> base64 PNG text."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG", compress_level=PNG_LEVEL)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def encoded_size_bound(height: int, width: int) -> int:
    """The most characters :func:`encode_image` can give an ``[height, width, 3]`` image: its raw rows (and PNG's
    filter byte per row) even when nothing compresses, zlib's and PNG's framing, then base64's 4/3."""
    raw = height * (3 * width + 1)
    return 4 * -(-(raw + raw // 1000 + 1024) // 3)


def open_image(text: str, max_pixels: int) -> Image.Image:
    """base64 PNG or JPEG -> a PIL image whose header (format, size) is read and checked; no pixel is decoded yet
    (PIL decodes lazily), so a server can add up the pixels of a whole request before it decodes any.

    Raises:
        MalformedMessage: not base64, not a PNG or JPEG.
        TooLarge: more than ``max_pixels`` pixels, or a size PIL itself calls a decompression bomb.
    """
    if not isinstance(text, str):
        raise MalformedMessage(f"expected a base64 string, got {type(text).__name__}")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise MalformedMessage(f"not base64 ({err})") from None
    try:  # formats=: no other decoder ever sees these bytes
        image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except Image.DecompressionBombError as err:
        raise TooLarge(f"image over PIL's decompression-bomb size ({err})") from None
    except (OSError, ValueError, SyntaxError) as err:  # PIL's plugins raise all three on garbage
        raise MalformedMessage(f"not a PNG or JPEG image ({err})") from None
    width, height = image.size
    if width * height > max_pixels:
        raise TooLarge(f"image of {width}x{height} pixels is over the server's limit of {max_pixels} (--max-pixels)")
    return image


def image_pixels(image: Image.Image) -> np.ndarray:
    """Decode an :func:`open_image` result -> uint8 ``[H, W, 3]``; MalformedMessage when its data is corrupt."""
    try:
        return np.asarray(image.convert("RGB"))
    except (OSError, ValueError, SyntaxError, EOFError) as err:  # truncated or corrupt pixel data
        raise MalformedMessage(f"cannot decode the image ({err})") from None
    finally:
        image.close()  # frees PIL's own copy of the decoded pixels now, not when the request ends


def decode_image(text: str, max_pixels: int) -> np.ndarray:
    """base64 PNG or JPEG -> uint8 ``[H, W, 3]`` (:func:`open_image`, then :func:`image_pixels`)."""
    return image_pixels(open_image(text, max_pixels))


def data_url(image: np.ndarray) -> str:
    """uint8 ``[H, W, 3]`` -> ``data:image/png;base64,...`` (OpenAI ``image_url`` content)."""
    return "data:image/png;base64," + encode_image(image)


def data_url_payload(url: str) -> str:
    """The base64 text of a ``data:image/...;base64,`` URL; MalformedMessage for anything else."""
    if not isinstance(url, str) or not url.startswith("data:image/") or ";base64," not in url:
        raise MalformedMessage("image_url must be a data:image/...;base64, URL (the server fetches nothing)")
    return url.split(";base64,", 1)[1]


def parse_score_response(body: object, frames: Sequence[int | None]) -> list[list[tuple[float, str | None]]]:
    """Per request entry, its ``(score, error)`` pairs from a ``/score`` answer: ``frames[i]`` None for an image
    (one pair, sent as a plain score), else the entry's number of video frames (lists of that length).

    Raises:
        MalformedMessage: the answer does not have that shape (a service bug or not a reward server).
    """
    if not isinstance(body, dict) or not isinstance(body.get("rewards"), list) or not isinstance(
            body.get("errors"), list):
        raise MalformedMessage("expected a JSON object with 'rewards' and 'errors' lists")
    rewards, errors = body["rewards"], body["errors"]
    if len(rewards) != len(frames) or len(errors) != len(frames):
        raise MalformedMessage(f"expected {len(frames)} rewards and errors, got {len(rewards)} and {len(errors)}")
    samples = []
    for reward, error, count in zip(rewards, errors, frames):
        scores, reasons = ([reward], [error]) if count is None else (reward, error)
        if not isinstance(scores, list) or not isinstance(reasons, list) or not len(scores) == len(reasons) == (
                count or 1):
            raise MalformedMessage(f"expected {count or 1} scores and errors per entry, got {str(reward)[:60]} and "
                                   f"{str(error)[:60]}")
        if not all(is_finite_number(s) for s in scores) or not all(r is None or isinstance(r, str) for r in reasons):
            raise MalformedMessage(f"expected finite numbers and null/string errors, got {str(reward)[:60]} and "
                                   f"{str(error)[:60]}")
        samples.append([(float(s), r) for s, r in zip(scores, reasons)])
    return samples


def parse_chat_text(body: object) -> str:
    """The assistant's text of an OpenAI chat-completions answer; MalformedMessage if it has none."""
    try:
        content = body["choices"][0]["message"]["content"]  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        raise MalformedMessage("expected choices[0].message.content in the chat-completions answer") from None
    if content is None:  # some servers send null for an empty answer
        return ""
    if not isinstance(content, str):
        raise MalformedMessage(f"expected a string message content, got {type(content).__name__}")
    return content

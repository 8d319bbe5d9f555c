"""Request limits both HTTP servers hold to (the reward server, ``server.py``; the GenEval detector server,
``rewards/geneval/detector_server.py``): what a request may carry, the deadline it must arrive within, the slots
of requests past their body, the cap on open connections, and the raw answers a server sends before any handler
runs; for a thread-per-connection ``http.server`` (the detector server's), the reader that holds a socket to the
deadline and the server that enforces the cap. The aiohttp side of the same rules is in ``server.py``.

Standard library only: the detector server runs in an environment without rlrunner (an older torch) and loads this
file by its path, so neither server carries a copy that could drift from the other's.

The rules, the same on both servers:

* **Deadline.** A request must arrive whole, head and body, within ``timeout_s`` of the moment the server is ready
  to read it (the connection accepted, or the previous answer sent on a kept-alive one). It is one deadline, not a
  timeout per read: a body trickled one byte a second is cut off when it passes, with a 408. A connection that
  sends nothing is closed at it.
* **Slots.** Only a request whose body is read (and whose token was checked before) waits for a slot to decode and
  score; a slow client holds a connection, never a slot.
* **Connections.** At most ``max_connections`` are open at once; one more is answered 503 with ``Retry-After`` and
  closed at once, without a thread or a handler of its own. Bodies in memory are bounded by ``max_connections *
  max_request_bytes``, pixels being decoded by the slots.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: Seconds a client refused for too many connections is asked to wait (``Retry-After``).
RETRY_AFTER_S = 1
#: After an answer sent before the whole body was read, how long the rest is read and dropped before the connection
#: closes, so that closing a socket with unread data (a TCP reset) cannot destroy the answer before the client
#: reads it; no longer, so a client that keeps trickling does not keep its connection.
LINGER_S = 2.0


@dataclass(frozen=True)
class Limits:
    """What one request may carry, how long it may take to arrive, and how many connections may be open.

    ``max_request_bytes`` of body (64 MiB), ``max_images`` images (256; video frames count; the detector server's
    default is 64), ``max_pixels`` pixels per image (4096²) and ``max_request_pixels`` over all its images (2**26 =
    256 images of 512², 192 MiB decoded); ``timeout_s`` (60): the deadline for head and body together, and for an
    idle connection before it is closed; ``max_connections`` (32) open at once.
    """

    max_request_bytes: int = 64 * 2**20
    max_images: int = 256
    max_pixels: int = 4096 * 4096
    max_request_pixels: int = 2**26
    timeout_s: float = 60.0
    max_connections: int = 32

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if not value > 0:
                raise ValueError(f"limit {name} is {value!r}; it must be positive")


#: the command-line option of each limit, the same on both servers
OPTIONS = {"max_images": "--max-batch", "max_request_bytes": "--max-request-mb", "max_pixels": "--max-pixels",
           "max_request_pixels": "--max-request-pixels", "timeout_s": "--timeout",
           "max_connections": "--max-connections"}


def add_limit_options(parser: argparse.ArgumentParser, defaults: Limits) -> None:
    """Every limit as an option of a server's command line (:data:`OPTIONS`), ``defaults`` shown."""
    parser.add_argument("--max-batch", type=int, default=defaults.max_images, help="images (video frames) per request")
    parser.add_argument("--max-request-mb", type=float, default=defaults.max_request_bytes / 2**20,
                        help="MiB of body per request")
    parser.add_argument("--max-pixels", type=int, default=defaults.max_pixels, help="pixels per image")
    parser.add_argument("--max-request-pixels", type=int, default=defaults.max_request_pixels,
                        help="pixels over all images of a request, added up from their headers before any decode")
    parser.add_argument("--timeout", type=float, default=defaults.timeout_s,
                        help="seconds a request (head and body) may take to arrive, and an idle connection stays open")
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections,
                        help="connections open at once; one more is answered 503 with Retry-After, without a thread")


def limits_from_options(args: argparse.Namespace) -> Limits:
    """The limits that the options of :func:`add_limit_options` set; a ValueError names an option that is not
    positive."""
    given = {"max_images": args.max_batch, "max_request_bytes": int(args.max_request_mb * 2**20),
             "max_pixels": args.max_pixels, "max_request_pixels": args.max_request_pixels, "timeout_s": args.timeout,
             "max_connections": args.max_connections}
    for name, option in OPTIONS.items():
        if not given[name] > 0:
            shown = args.max_request_mb if name == "max_request_bytes" else given[name]
            raise ValueError(f"{option} {shown} must be positive")
    return Limits(**given)


@dataclass(frozen=True)
class Deadline:
    """A moment on the monotonic clock (``time.monotonic()`` seconds) by which a request must have arrived."""

    at: float

    @classmethod
    def after(cls, seconds: float, now: float | None = None) -> Deadline:
        return cls((time.monotonic() if now is None else now) + seconds)

    def left(self, now: float | None = None) -> float:
        """Seconds until the deadline, 0 once it has passed (never negative: it feeds socket timeouts)."""
        return max(0.0, self.at - (time.monotonic() if now is None else now))

    def passed(self, now: float | None = None) -> bool:
        return self.left(now) == 0.0


class Busy(Exception):
    """No slot came free within the wait: answered 503."""


class Slots:
    """At most ``count`` requests at once past their body (decoding, scoring). A thread server takes them with
    :meth:`held`, an asyncio server with :meth:`held_async`; one instance serves one kind of server."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"slots count is {count}; it must be at least 1")
        self.count = count
        self._threads = threading.BoundedSemaphore(count)
        self._tasks: asyncio.Semaphore | None = None  # made on first use, inside the serving loop

    def busy_message(self) -> str:
        return f"busy: {self.count} requests in progress; try again"

    @contextmanager
    def held(self, wait_s: float | None) -> Iterator[None]:
        """A slot for the ``with`` block, waited for up to ``wait_s`` seconds (``None``: as long as it takes)."""
        if not self._threads.acquire(timeout=-1 if wait_s is None else wait_s):
            raise Busy(self.busy_message())
        try:
            yield
        finally:
            self._threads.release()

    @asynccontextmanager
    async def held_async(self, wait_s: float | None) -> AsyncIterator[None]:
        if self._tasks is None:
            self._tasks = asyncio.Semaphore(self.count)
        try:
            await asyncio.wait_for(self._tasks.acquire(), wait_s)
        except asyncio.TimeoutError:
            raise Busy(self.busy_message()) from None
        try:
            yield
        finally:
            self._tasks.release()


class ConnectionCap:
    """Counts open connections, thread-safely, and admits at most ``limit`` at once."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_connections is {limit}; it must be at least 1")
        self.limit = limit
        self.open = 0
        self._lock = threading.Lock()

    def admit(self) -> bool:
        """True and counted if another connection fits; every True must be followed by one :meth:`release`."""
        with self._lock:
            if self.open >= self.limit:
                return False
            self.open += 1
            return True

    def release(self) -> None:
        with self._lock:
            assert self.open > 0, "released a connection that was never admitted"
            self.open -= 1

    def refusal(self) -> bytes:
        """The answer to a connection over the cap."""
        return raw_answer(503, f"busy: {self.limit} connections open, the server's limit (--max-connections); "
                               f"try again", retry_after_s=RETRY_AFTER_S)


class DeadlineReader(socket.SocketIO):
    """A socket's reads held to one ``deadline`` (set per request): each waits only for what is left of it, so a
    request trickled a byte at a time still ends there (``TimeoutError``, and ``late`` is set)."""

    deadline: Deadline
    late = False
    received = 0  # bytes read: a connection that sent nothing is closed at the deadline without an answer

    def __init__(self, connection: socket.socket) -> None:
        super().__init__(connection, "rb")
        self.connection = connection

    def readinto(self, buffer: Any) -> int | None:
        left = self.deadline.left()
        if left == 0:
            self.late = True
            raise TimeoutError("the request's deadline has passed")
        self.connection.settimeout(left)
        try:
            count = super().readinto(buffer)
        except TimeoutError:
            self.late = True
            raise
        self.received += count or 0
        return count


class CappedThreadingServer(ThreadingHTTPServer):
    """A thread per connection, up to ``cap``; a connection over it is answered 503 from the accepting thread and
    closed, so a flood of connections starts no threads (and reaches no handler, no token check)."""

    request_queue_size = 64  # the listen backlog: a burst over the cap is answered, not left in SYN queues

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], cap: ConnectionCap) -> None:
        self.cap = cap
        super().__init__(address, handler)

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        if not self.cap.admit():
            try:
                request.setblocking(False)  # never wait on a client from the accepting thread
                request.send(self.cap.refusal())
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.cap.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.cap.release()


def late_message(limits: Limits) -> str:
    """The 408 message: a request (head or body) that missed its deadline."""
    return f"the request did not arrive within {limits.timeout_s} s (--timeout)"


def raw_answer(status: int, message: str, retry_after_s: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer ``{"error": message}`` that closes the connection, as bytes: for a server to send
    before (or without) a request handler, so it is JSON like every other answer."""
    body = json.dumps({"error": message}).encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: close"]
    if retry_after_s is not None:
        head.append(f"Retry-After: {retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body

"""The reward server's connection layer (aiohttp): serving an app under limits.py's deadline and connection cap,
and the middlewares every route passes (JSON errors, the bearer token, the deadline's phases)."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from .limits import LINGER_S, ConnectionCap, Deadline, Limits, late_message, raw_answer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
logger = logging.getLogger(__name__)


def serve(app: web.Application, host: str, port: int, limits: Limits) -> None:
    """Serve ``app`` on ``host:port`` until interrupted, held to ``limits``' deadline and connection cap."""
    asyncio.run(_serve(app, host, port, limits))


async def _serve(app: web.Application, host: str, port: int, limits: Limits) -> None:
    # aiohttp's keep-alive timeout only backs up the deadline's timer, which closes an idle connection first
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=limits.timeout_s + 1, lingering_time=LINGER_S)
    await runner.setup()
    loop, server, cap = asyncio.get_running_loop(), runner.server, ConnectionCap(limits.max_connections)
    # aiohttp's own protocol under the limits (``_kwargs``: aiohttp is pinned)
    listener = await loop.create_server(
        lambda: _LimitedProtocol(server, loop=loop, limits=limits, cap=cap, **server._kwargs), host, port,
        backlog=64)
    try:
        await listener.serve_forever()
    finally:
        listener.close()
        await runner.cleanup()


class _LimitedProtocol(RequestHandler):
    """aiohttp's protocol held to limits.py's rules, which aiohttp's timeouts do not give: its keep-alive timeout
    closes a connection whose head is still trickling in without an answer, and nothing of its own bounds a body.

    Each request has one deadline, from the connection's start or the previous answer, for head and body (the
    handler reads the body within what is left of it: ``server._read_json``); a timer at the deadline answers a head
    still arriving with 408 and closes an idle connection. Connections over the cap get 503 at once. Requests it
    cannot parse (a negative or non-numeric Content-Length, a garbled request line, an oversized header) get the
    JSON error line of every other failure, not aiohttp's plain text."""

    def __init__(self, *args: Any, limits: Limits, cap: ConnectionCap, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits, self.cap = limits, cap
        self.deadline = Deadline.after(limits.timeout_s)
        self.phase = "waiting"  # for the next request's first byte; then "head", "handling", "closing"
        self.admitted = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.cap.admit():  # never handed to aiohttp: no request is parsed, no handler runs
            transport.write(self.cap.refusal())  # type: ignore[attr-defined]
            transport.close()
            return
        self.admitted = True
        self.arm()  # before aiohttp's keep-alive timer, which it outruns
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.admitted:
            return
        self.admitted = False
        self.cap.release()
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if self.phase == "waiting" and data:
            self.phase = "head"
        super().data_received(data)

    def arm(self) -> None:
        """The next request's deadline starts now."""
        if self._timer is not None:
            self._timer.cancel()
        if not self.admitted:  # closed while its last request was handled: no next one
            return
        self.deadline, self.phase = Deadline.after(self.limits.timeout_s), "waiting"
        self._timer = asyncio.get_running_loop().call_later(self.limits.timeout_s, self._at_deadline)

    def _at_deadline(self) -> None:
        self._timer = None
        if self.phase == "handling":  # the handler holds its body to the deadline (408) and answers
            return
        if self.phase == "head" and self.transport is not None:
            self.transport.write(raw_answer(408, late_message(self.limits)))
        self.force_close()

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: a reply already half sent cannot become another one
            raise ConnectionError("an answer is sent already, cannot send the error answer")
        text = (message or "internal server error").split("\n")[0].rstrip(": ")[:200]
        # one short line, not aiohttp's log of the offending bytes: a client sending 1 MiB of garbage per request
        # must not write 1 MiB of log per request
        logger.warning("HTTP %d to %s: %s", status, request.remote, text, exc_info=status >= 500)
        response = web.json_response({"error": text}, status=status)
        response.force_close()
        return response


@web.middleware
async def deadline_phase(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tells a :class:`_LimitedProtocol` when a request is being handled; after it, the next deadline starts, or,
    if the body was left unread (answered from its head), the connection closes once aiohttp has drained it."""
    protocol = request.protocol
    if not isinstance(protocol, _LimitedProtocol):  # served by a plain aiohttp runner (tests)
        return await handler(request)
    protocol.phase = "handling"
    response = None
    try:
        response = await handler(request)
        return response
    finally:
        if request.content.at_eof():
            protocol.arm()
        else:
            protocol.phase = "closing"
            if response is not None:
                response.force_close()


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as ``{"error": "<one line>"}`` with its status (aiohttp's 413 included; 500 for a fault here)."""
    try:
        return await handler(request)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        return web.json_response({"error": err.text or err.reason}, status=err.status, headers=_auth_header(err))
    except Exception as err:  # the served reward raised: a server fault, which clients may retry
        logger.exception("%s %s failed", request.method, request.path)
        return web.json_response({"error": f"the server failed: {type(err).__name__}: {err}"[:300]}, status=500)


def _auth_header(err: web.HTTPException) -> dict[str, str]:
    value = err.headers.get("WWW-Authenticate")
    return {"WWW-Authenticate": value} if value else {}


def bearer(token: str) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if token and not hmac.compare_digest(given, expected):  # constant time: no token prefix can be guessed
            raise web.HTTPUnauthorized(text="missing or wrong bearer token (Authorization: Bearer <token>)",
                                       headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return check

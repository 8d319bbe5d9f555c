"""Real HTTP servers on 127.0.0.1 for the reward-service tests: the reward server as a process, and a stub.

The stub (``StubServer``) is a real threaded HTTP server whose answers are scripted (500, malformed JSON, slow),
for the faults that the real server never produces on purpose. No client code is mocked.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import requests

if TYPE_CHECKING:
    from typing_extensions import Self

REPO = Path(__file__).resolve().parents[1]
STARTUP_S = 120.0  # the server imports the OCR engine first; the machine may be busy


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def reward_server(*args: str, token: str = "") -> Iterator[tuple[str, subprocess.Popen]]:
    """``python -m rlrunner.serve_reward ARGS`` on a free loopback port; yields ``(url, process)`` once healthy."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "rlrunner.serve_reward", "--port", str(port), *args],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:  # bounded: the deadline or the process exiting ends it
            if process.poll() is not None:
                raise RuntimeError(f"reward server exited: {process.stdout.read()}")
            try:
                if requests.get(f"{url}/health", headers=headers, timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"reward server did not answer /health within {STARTUP_S} s")
            time.sleep(0.2)
        yield url, process
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> None:
    """End the server process we started (by its handle) and reap it."""
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)
    if process.stdout:
        process.stdout.close()


Answer = Callable[[dict], tuple[int, bytes]]


class StubServer:
    """A real HTTP server on 127.0.0.1 answering every request with ``answer(json_body)`` (status, body bytes);
    counts the requests it got."""

    def __init__(self, answer: Answer, delay_s: float = 0.0) -> None:
        stub = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # health checks
                self._reply(200, b'{"status": "ok"}')

            def do_POST(self) -> None:
                stub.requests += 1
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(delay_s)
                self._reply(*answer(body))

            def _reply(self, status: int, payload: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

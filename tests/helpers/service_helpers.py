"""Real HTTP servers on 127.0.0.1 for the reward-service tests: the reward server as a process, and a stub.

The stub (``StubServer``) is a real threaded HTTP server whose answers are scripted (500, malformed JSON, slow),
for the faults that the real server never produces on purpose. No client code is mocked.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import requests

if TYPE_CHECKING:
    from typing_extensions import Self

REPO = Path(__file__).resolve().parents[2]
STARTUP_S = 120.0  # the server imports the OCR engine first; the machine may be busy


@dataclass(frozen=True)
class AbuseLimits:
    """The limits the abused servers run with: small, so that each is cheap to cross and memory stays low."""

    max_request_bytes: int = 2**20
    max_images: int = 8
    max_pixels: int = 2**22
    max_request_pixels: int = 2**20
    timeout_s: float = 1.0  # a truncated body is answered (408) after it

    def serve_args(self) -> tuple[str, ...]:
        return ("--max-request-mb", str(self.max_request_bytes / 2**20), "--max-batch", str(self.max_images),
                "--max-pixels", str(self.max_pixels), "--max-request-pixels", str(self.max_request_pixels),
                "--timeout", str(self.timeout_s))


SERVER_LIMITS = AbuseLimits()


@dataclass(frozen=True)
class Server:
    """A server process under test: its loopback ``port``, ``pid``, scoring ``route`` and peak memory (MiB) once
    it had started."""

    port: int
    pid: int
    route: str
    startup_rss_mib: float

    @property
    def kind(self) -> str:
        return "reward" if self.route == "/score" else "detector"

    def body(self, images: list, prompts: list | None = None) -> dict:
        """A request body of this server's route for ``images`` (the reward server's also holds prompts)."""
        if self.kind == "detector":
            return {"images": images}
        return {"prompts": ["a prompt"] * len(images) if prompts is None else prompts, "images": images}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def reward_server(*args: str, token: str = "") -> Iterator[tuple[str, subprocess.Popen]]:
    """``python -m rlrunner.commands.serve_reward ARGS`` on a free loopback port; yields ``(url, process)`` once healthy."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # its output goes to a file: a pipe nobody drains fills up and then blocks the server mid-log
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen([sys.executable, "-m", "rlrunner.commands.serve_reward", "--port", str(port), *args],
                                   env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + STARTUP_S
            while True:  # bounded: the deadline or the process exiting ends it
                if process.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"reward server exited: {log.read()}")
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


def answer_complete(answer: bytes) -> bool:
    """Whether ``answer`` holds a whole HTTP answer: its head and as many body bytes as its Content-Length says."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return bool(sep and length and len(body) >= int(length.group(1)))


def raw_request(port: int, data: bytes, timeout_s: float = 30.0) -> tuple[int, bytes]:
    """``data`` sent as is on a new connection to 127.0.0.1:``port``; the answer's ``(status, body)``.

    Status 0 means the server closed the connection (or stayed silent past ``timeout_s``) without an answer: a
    dropped connection.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        answer = b""
        try:
            sock.sendall(data)
            while True:  # bounded: the server closes, the answer completes, or the timeout ends it
                chunk = sock.recv(2**16)
                if not chunk:
                    break
                answer += chunk
                if answer_complete(answer):
                    break
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            pass
    status = re.match(rb"HTTP/\d\.\d (\d{3}) ", answer)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return (int(status.group(1)) if status else 0), body[: int(length.group(1))] if length else body


def peak_rss_mib(pid: int) -> float:
    """The peak resident memory (VmHWM) of process ``pid`` so far, in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


@contextmanager
def detector_server(limits: dict, token: str = "") -> Iterator[tuple[int, subprocess.Popen]]:
    """The GenEval detector server (tests/helpers/detector_probe.py: its HTTP side around a pixel-statistics detector) on a
    free loopback port, in a process of its own; yields ``(port, process)`` once it listens."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, str(REPO / "tests" / "helpers" / "detector_probe.py"), json.dumps(limits), token],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = process.stdout.readline()  # "port N" once listening, or "" if it died
        if not line.startswith("port "):
            raise RuntimeError(f"detector server did not start: {line!r}")
        yield int(line.split()[1]), process
    finally:
        stop(process)

"""Both servers (the reward server and the GenEval detector server, each in a process of its own on 127.0.0.1)
against slow and numerous clients: a request trickled a byte at a time is cut off by one deadline for head and
body (408), slow clients hold no request slot, so a well-formed request is answered while they trickle, and
connections over the cap are answered 503 at once, starting no thread (limits.py's rules)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from service_helpers import SERVER_LIMITS, Server, answer_complete, detector_server, peak_rss_mib, reward_server

from rlrunner.rewards.serving.wire import encode_image

DEADLINE_S = 4.0  # over the trickle's gap, so a timeout per read (the defect) would never end a trickle
TRICKLE_GAP_S = 1.5
MAX_CONNECTIONS = 6  # four tricklers, the well-formed request, one spare
SLACK_S = 2.5  # scheduling on a busy 2-core machine


@pytest.fixture(scope="module", params=["reward", "detector"])
def target(request) -> Iterator[Server]:
    """One of the two servers, with a deadline of DEADLINE_S and a cap of MAX_CONNECTIONS."""
    limits = {**SERVER_LIMITS.__dict__, "timeout_s": DEADLINE_S, "max_connections": MAX_CONNECTIONS}
    if request.param == "detector":
        with detector_server(limits) as (port, process):
            yield Server(port, process.pid, "/detect", peak_rss_mib(process.pid))
        return
    options = [*SERVER_LIMITS.serve_args(), "--timeout", str(DEADLINE_S), "--max-connections", str(MAX_CONNECTIONS)]
    with reward_server("--reward", "image_stats", *options) as (url, process):
        yield Server(int(url.rsplit(":", 1)[1]), process.pid, "/score", peak_rss_mib(process.pid))


def trickle(port: int, first: bytes, byte: bytes) -> tuple[float, int, bytes, int]:
    """``first`` at once, then ``byte`` every TRICKLE_GAP_S until the server's answer is complete or it closes (at
    most 30 s): ``(seconds until then, status or 0, body, bytes trickled)``."""
    started, answer, sent = time.monotonic(), b"", 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(first)
        sock.settimeout(TRICKLE_GAP_S)
        while time.monotonic() - started < 30:  # bounded: the server's answer or closing ends it first
            try:
                chunk = sock.recv(2**16)
            except TimeoutError:
                try:
                    sock.sendall(byte)
                    sent += 1
                except OSError:
                    break
                continue
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
            if answer_complete(answer):
                break
    took = time.monotonic() - started
    status = re.match(rb"HTTP/1\.[01] (\d{3}) ", answer)
    return took, int(status.group(1)) if status else 0, answer.partition(b"\r\n\r\n")[2], sent


def valid_body(target: Server) -> dict:
    return target.body([encode_image(np.zeros((16, 16, 3), np.uint8))])


@pytest.mark.parametrize("part", ["body", "head"])
def test_trickling_clients_do_not_starve_a_well_formed_request_and_are_cut_off_by_the_deadline(target, part):
    """Four clients trickle a body (or a head) one byte per 1.5 s; a fifth request is answered 200 at once, and
    each trickler gets a 408 when the deadline passes, however slowly it sends (before: the detector server's
    timeout was per read, so a trickle never ended, and both servers gave the tricklers the request slots)."""
    head = f"POST {target.route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    first = (head + "Content-Length: 1000\r\n\r\n").encode() if part == "body" else head.encode()
    results: list[tuple[float, int, bytes, int]] = []
    tricklers = [threading.Thread(target=lambda: results.append(trickle(target.port, first, b" " if part == "body"
                                                                       else b"X"))) for _ in range(4)]
    for thread in tricklers:
        thread.start()
    time.sleep(0.5)  # the tricklers are connected and have sent their first bytes
    started = time.monotonic()
    answer = requests.post(f"http://127.0.0.1:{target.port}{target.route}", json=valid_body(target), timeout=30)
    assert answer.status_code == 200, answer.text
    assert time.monotonic() - started < 1.5  # not after the tricklers' deadline
    for thread in tricklers:
        thread.join(timeout=60)
    assert len(results) == 4
    for took, status, body, sent in results:
        assert status == 408, body
        assert "did not arrive within" in json.loads(body)["error"]
        assert sent >= 1  # still trickling when cut off: a timeout per read would have waited on
        assert DEADLINE_S - 0.1 <= took < DEADLINE_S + SLACK_S


def open_idle(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that send nothing (each held open by the server until the deadline)."""
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]


def refused(port: int) -> tuple[int, bytes, bytes]:
    """A new connection that sends nothing: ``(status or 0, head, body)`` of what the server sends on its own."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        answer = b""
        while chunk := sock.recv(2**16):  # bounded: the socket timeout, or the server closing
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status = re.match(rb"HTTP/1\.[01] (\d{3}) ", head)
    return int(status.group(1)) if status else 0, head, body


def threads_of(pid: int) -> int:
    return int(re.search(r"Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))


def test_connections_over_the_cap_get_503_at_once_and_start_no_thread(target):
    idle = open_idle(target.port, MAX_CONNECTIONS)
    try:
        time.sleep(0.3)  # the server has taken them all (the detector server: a thread each)
        threads = threads_of(target.pid)
        for _ in range(3 * MAX_CONNECTIONS):
            started = time.monotonic()
            status, head, body = refused(target.port)
            assert status == 503, (head, body)
            assert time.monotonic() - started < 1.0  # at once, not at the deadline
            assert re.search(rb"(?im)^retry-after: 1\r?$", head)
            assert "--max-connections" in json.loads(body)["error"]
        assert threads_of(target.pid) <= threads  # none started for the connections over the cap
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.3)  # the server sees them closed
    answer = requests.post(f"http://127.0.0.1:{target.port}{target.route}", json=valid_body(target), timeout=30)
    assert answer.status_code == 200, answer.text  # the cap counts open connections: closed ones free it

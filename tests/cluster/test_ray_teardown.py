"""The Ray backend's teardown helpers without a Ray: the GCS probe's connection check and the bound on a call."""

from __future__ import annotations

import socket
import threading
import time

from rlrunner.cluster.ray_teardown import accepts_connections, bounded, gcs_reachable


def test_a_listening_port_accepts_and_a_closed_one_is_refused_at_once():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert accepts_connections(address, 2.0)
    started = time.monotonic()
    assert not accepts_connections(address, 2.0)  # nobody listens there any more
    assert time.monotonic() - started < 1.0
    assert not accepts_connections("127.0.0.1", 2.0)  # no port


def test_without_a_connected_ray_there_is_no_gcs_to_reach():
    assert not gcs_reachable()


def test_a_call_that_blocks_is_left_behind_after_its_bound_and_errors_are_suppressed():
    release = threading.Event()
    started = time.monotonic()
    assert not bounded(release.wait, "wait", timeout_s=0.2)
    assert time.monotonic() - started < 2.0
    release.set()
    assert bounded(lambda: 1 / 0, "divide")  # returned (with an error, as Ray going down may raise)

"""The request-limits module both servers share (rlrunner/rewards/serving/limits.py), by hand: the deadline's
arithmetic, the connection cap's count, the slots' wait, the raw answers, and limits that must be positive."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from rlrunner.rewards.serving.limits import Busy, ConnectionCap, Deadline, Limits, Slots, raw_answer


def test_a_deadline_counts_down_from_its_start_and_stops_at_zero():
    deadline = Deadline.after(4.0, now=100.0)
    assert deadline.at == 104.0
    assert deadline.left(now=101.5) == 2.5  # one deadline: time spent on earlier reads is gone
    assert not deadline.passed(now=103.999)
    assert deadline.left(now=104.0) == 0.0 and deadline.passed(now=104.0)
    assert deadline.left(now=250.0) == 0.0  # never negative: it becomes a socket timeout


def test_the_connection_cap_admits_up_to_its_limit_and_again_after_a_release():
    cap = ConnectionCap(2)
    assert [cap.admit(), cap.admit(), cap.admit()] == [True, True, False]
    assert cap.open == 2
    cap.release()
    assert cap.admit() and not cap.admit()
    status_line, _, rest = cap.refusal().partition(b"\r\n")
    head, _, body = rest.partition(b"\r\n\r\n")
    assert status_line == b"HTTP/1.1 503 Service Unavailable"
    assert b"Retry-After: 1" in head.split(b"\r\n") and b"Connection: close" in head.split(b"\r\n")
    assert "--max-connections" in json.loads(body)["error"]


def test_a_raw_answer_is_json_with_its_exact_length():
    answer = raw_answer(408, "late")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert f"Content-Length: {len(body)}".encode() in head.split(b"\r\n")
    assert json.loads(body) == {"error": "late"}


def test_a_thread_waits_for_a_slot_only_as_long_as_it_is_told():
    slots, got = Slots(1), []

    def wait_for_the_slot() -> None:
        with slots.held(5):
            got.append("in")

    with slots.held(None):
        started = time.monotonic()
        with pytest.raises(Busy, match="1 requests in progress"), slots.held(0.2):
            pass
        assert 0.2 <= time.monotonic() - started < 2
        waiter = threading.Thread(target=wait_for_the_slot)
        waiter.start()
        time.sleep(0.1)
        assert not got  # still waiting: the one slot is held here
    waiter.join(timeout=5)
    assert got == ["in"]  # given back, it went to the thread waiting for it


def test_a_task_waits_for_a_slot_only_as_long_as_it_is_told():
    async def scenario() -> list[str]:
        slots, order = Slots(2), []

        async def hold(name: str, seconds: float) -> None:
            async with slots.held_async(None):
                order.append(f"{name} in")
                await asyncio.sleep(seconds)

        first, second = asyncio.create_task(hold("a", 0.3)), asyncio.create_task(hold("b", 0.3))
        await asyncio.sleep(0.05)
        with pytest.raises(Busy):
            async with slots.held_async(0.05):
                pass
        await hold("c", 0)  # waits for a or b, then gets in
        await asyncio.gather(first, second)
        return order

    assert asyncio.run(scenario()) == ["a in", "b in", "c in"]


@pytest.mark.parametrize("field", ["max_request_bytes", "max_images", "max_pixels", "max_request_pixels",
                                   "timeout_s", "max_connections"])
def test_every_limit_must_be_positive(field):
    with pytest.raises(ValueError, match=f"limit {field} is 0; it must be positive"):
        Limits(**{field: 0})


@pytest.mark.parametrize("option, value", [("--max-batch", "0"), ("--max-request-mb", "0"), ("--max-pixels", "-1"),
                                           ("--max-request-pixels", "0"), ("--timeout", "0"),
                                           ("--max-connections", "0")])
def test_both_servers_options_give_their_limits_and_name_a_bad_one(option, value):
    import argparse

    from rlrunner.rewards.serving.limits import Limits, add_limit_options, limits_from_options

    parser = argparse.ArgumentParser()
    add_limit_options(parser, Limits(max_images=64))
    assert limits_from_options(parser.parse_args([])) == Limits(max_images=64)
    assert limits_from_options(parser.parse_args(["--max-request-mb", "2", "--timeout", "5"])) == \
        Limits(max_request_bytes=2 * 2**20, max_images=64, timeout_s=5.0)
    shown = float(value) if option in ("--max-request-mb", "--timeout") else int(value)
    with pytest.raises(ValueError, match=f"^{option} {shown} must be positive$"):
        limits_from_options(parser.parse_args([option, value]))

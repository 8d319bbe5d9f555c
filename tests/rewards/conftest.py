"""Fixtures for the reward tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from reward_helpers import FakeEngine
from service_helpers import SERVER_LIMITS, Server, detector_server, peak_rss_mib, reward_server

from rlrunner.rewards import build_reward, installed_engines
from rlrunner.rewards.ocr.engines import ENGINES


@pytest.fixture(scope="session")
def ocr_reward():
    """One real OCR reward (the best installed engine) shared by the session."""
    if not installed_engines():
        pytest.skip("no OCR engine installed (pip install -r requirements/core.txt adds rapidocr)")
    return build_reward({"model": "ocr", "batch_size": 8})


@pytest.fixture
def fake_engine(monkeypatch):
    """Registers the fake engine as ``engine: fake`` and clears its call log."""
    monkeypatch.setitem(ENGINES, "fake", FakeEngine)
    FakeEngine.calls.clear()
    return FakeEngine


@pytest.fixture(scope="session")
def reward_service() -> Iterator[Server]:
    """The reward server (``serve_reward --reward image_stats``, SERVER_LIMITS) in its own process, for the tests
    that abuse it (test_server_limits.py, test_server_fuzz.py); shared, as it takes seconds to start."""
    with reward_server("--reward", "image_stats", *SERVER_LIMITS.serve_args()) as (url, process):
        yield Server(int(url.rsplit(":", 1)[1]), process.pid, "/score", peak_rss_mib(process.pid))


@pytest.fixture(scope="session")
def detector_service() -> Iterator[Server]:
    """The GenEval detector server (tests/helpers/detector_probe.py, SERVER_LIMITS) in its own process, shared likewise."""
    with detector_server(SERVER_LIMITS.__dict__) as (port, process):
        yield Server(port, process.pid, "/detect", peak_rss_mib(process.pid))

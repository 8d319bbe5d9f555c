"""Fixtures for the reward tests."""

from __future__ import annotations

import pytest
from reward_helpers import FakeEngine

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

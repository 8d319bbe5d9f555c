"""Fixtures shared by test folders."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray cluster of 8 CPUs for the tests of one module (Ray tests that start their own clusters do not
    use it)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()

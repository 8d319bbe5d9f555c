"""Fixtures and hooks shared by test folders."""

from __future__ import annotations

import os

import pytest

# Ray starts its worker processes at nice 15 so that its own daemons stay responsive. Beside another test process
# (scripts/test.sh runs two) that computes at nice 0, those workers then got almost no CPU: an actor's start-up
# waited out its worker timeout and a 2-node run lost its first step. Workers of the clusters tests start compute at
# the tests' own priority; subprocesses and `ray start` inherit this.
os.environ.setdefault("RAY_worker_niceness", "0")


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray cluster of 8 CPUs for the tests of one module (Ray tests that start their own clusters do not
    use it)."""
    ray = pytest.importorskip("ray")
    # "local": a new cluster even when a `ray start` of another test process runs on this machine (a plain
    # ray.init() would join that one)
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first, then the other end-to-end runs (``slow``), each group in its usual order: with test
    processes (``pytest -n``, which hands out whole files in this order) the long runs then overlap the many short
    tests instead of trailing after them in one process."""
    items.sort(key=lambda item: (item.get_closest_marker("longest") is None, item.get_closest_marker("slow") is None))


class FileStarts:
    """With test processes, pytest's progress is dots without file names; this names each file as its first test
    starts, so that a file running for minutes is named on screen as it is without them."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started: set[str] = set()

    def pytest_runtest_logstart(self, nodeid: str, location: tuple) -> None:
        file = nodeid.split("::", 1)[0]
        if file not in self.started:
            self.started.add(file)
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter._tw.width_of_current_line:  # after a line of dots
                reporter.write("\n")
            reporter.write_line(f"{file} started")


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's controller: the process that reports for the test processes (which have workerinput)
    controller = getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")
    if controller and config.option.verbose <= 0:
        config.pluginmanager.register(FileStarts(config), "rlrunner-file-starts")

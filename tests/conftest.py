"""Fixtures and hooks shared by test folders."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray cluster of 8 CPUs for the tests of one module (Ray tests that start their own clusters do not
    use it)."""
    ray = pytest.importorskip("ray")
    # "local": a new cluster even when a `ray start` of another test runs on this machine (ray.init() would join it)
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


# the two longest tests, started before every other: the learning test (two 40-step runs of the default recipe,
# 7.5 minutes alone) and the device check's rehearsal (2.7 minutes); started late, each trailed the others
LONGEST = ("test_the_default_recipe_learns_from_its_reward", "test_tiny_check_runs_every_part_and_writes_the_table")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first, then the other end-to-end runs (``slow``) in their usual order: with test processes
    (``pytest -n``) the long runs then overlap the many short tests instead of trailing after them in one process.
    The tests that start a Ray
    cluster (``ray``) all go to one test process (``--dist loadgroup``), one cluster at a time: with two clusters at
    once, a Ray run's actor twice waited out its worker timeout (cause not found)."""
    items.sort(key=lambda item: (item.name not in LONGEST, item.get_closest_marker("slow") is None))
    for item in items:
        if item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group("ray"))


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

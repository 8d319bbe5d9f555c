"""A pytest plugin that measures each test's CPU time, for the suite's budget: on 2 cores the suite is bound by the
CPU its tests spend, not by their wall time, and most of that CPU is spent in the processes a test starts (the
launcher, Ray's workers), which pytest's durations do not see.

    bash scripts/test.sh -p cpu_profile                 # the whole suite
    bash scripts/test.sh -p cpu_profile -m "not slow"

Each test's CPU is its test process's own plus that of every process it starts, polled every 0.25 s (a process
that starts and ends between two polls, or the last 0.25 s of one, is missed: the figures are a little low). Each
test process appends one JSON line per test to ``$RLRUNNER_CPU_PROFILE`` (default ``test-cpu.jsonl`` in the
current folder): ``id``, ``wall_s``, ``cpu_s`` and ``processes`` (how many it started); the session ends with the
20 tests that spent the most.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import psutil
import pytest

POLL_S = 0.25
SHOWN = 20


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


class TreeCpu(threading.Thread):
    """CPU seconds of this process and of every process started below it while it runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.me = psutil.Process()
        self.done = threading.Event()
        self.before = {key: cpu for key, cpu in self._children()}  # processes already running: only their increase
        self.latest: dict[tuple[int, float], float] = {}
        self.own_start = _cpu_s(self.me)

    def _children(self) -> list[tuple[tuple[int, float], float]]:
        found = []
        for child in self.me.children(recursive=True):
            try:
                found.append(((child.pid, child.create_time()), _cpu_s(child)))
            except psutil.Error:  # it ended while we looked
                pass
        return found

    def _poll(self) -> None:
        for key, cpu in self._children():
            self.latest[key] = max(self.latest.get(key, 0.0), cpu)

    def run(self) -> None:
        while not self.done.wait(POLL_S):
            self._poll()

    def stop(self) -> tuple[float, int]:
        """The CPU seconds spent since the start and the number of processes started meanwhile."""
        self.done.set()
        self.join()
        self._poll()
        children = sum(cpu - self.before.get(key, 0.0) for key, cpu in self.latest.items())
        return _cpu_s(self.me) - self.own_start + children, len(self.latest.keys() - self.before.keys())


def _output() -> Path:
    return Path(os.environ.get("RLRUNNER_CPU_PROFILE", "test-cpu.jsonl"))


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller (or the only process): a fresh file per run
        _output().unlink(missing_ok=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    tree = TreeCpu()
    tree.start()
    started = time.perf_counter()
    yield
    cpu, processes = tree.stop()
    record = {"id": item.nodeid, "wall_s": round(time.perf_counter() - started, 2), "cpu_s": round(cpu, 2),
              "processes": processes}
    with _output().open("a") as out:  # one line per write: the test processes append to the same file
        out.write(json.dumps(record) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _output().is_file():  # a test process; the summary is the controller's
        return
    records = [json.loads(line) for line in _output().read_text().splitlines() if line.strip()]
    total = sum(r["cpu_s"] for r in records)
    terminalreporter.write_sep("=", f"CPU per test ({_output()}): {len(records)} tests, {total:.0f} s of CPU")
    for r in sorted(records, key=lambda r: -r["cpu_s"])[:SHOWN]:
        terminalreporter.write_line(f"{r['cpu_s']:8.1f} s CPU {r['wall_s']:8.1f} s wall {r['processes']:4d} "
                                    f"processes  {r['id']}")

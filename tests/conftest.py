"""Fixtures and hooks shared by the test folders (tests/<package>/ mirrors rlrunner/<package>/; tests/project/ holds
the docs, links, layout, environment and bench tests; tests/helpers/ the modules they import; tests/fixtures/ data)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_pipelines import FAMILY_RUN, TINY_FAMILY_SETTINGS, TINY_WRITERS, tiny_family_cfg, write_tiny_flux1

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


# the tiny pipeline folders of every family (tests/helpers/tiny_pipelines.py), for every folder's tests

@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> Callable[[str], Path]:
    """``tiny_dirs(model_type)``: the family's tiny pipeline folder, written once per session."""
    torch.set_num_threads(1)
    cache: dict[str, Path] = {}

    def get(model_type: str) -> Path:
        if model_type not in cache:
            cache[model_type] = TINY_WRITERS[model_type](tmp_path_factory.mktemp(model_type))
        return cache[model_type]

    return get


@pytest.fixture(scope="session")
def tiny_flux1_schnell_dir(tmp_path_factory) -> Path:
    """A tiny FLUX.1-schnell layout (no guidance embedding, the dynamic shift off), written once per session."""
    return write_tiny_flux1(tmp_path_factory.mktemp("flux1_schnell"), schnell=True)


@pytest.fixture
def load_tiny(tiny_dirs) -> Callable[..., Any]:
    """``load_tiny(model_type, path=None, dtype=float32, **family_overrides)``: ``<Family>.load`` on CPU.

    ``path`` defaults to the family's tiny pipeline folder; the class comes from the registry.
    """
    from rlrunner.models import model_class

    def load(model_type: str, path: str | Path | None = None, dtype: torch.dtype = torch.float32, **overrides: Any):
        cfg = tiny_family_cfg(model_type, **overrides)
        path = tiny_dirs(model_type) if path is None else path
        return model_class(model_type).load(str(path), cfg, device=torch.device("cpu"), dtype=dtype)

    return load


@pytest.fixture(scope="session")
def tiny_model_cfg(tiny_dirs) -> Callable[[str], Any]:
    """``tiny_model_cfg(model_type)``: ``actor.model`` (fp32, CPU) on the family's tiny folder, as workers take it."""
    from omegaconf import OmegaConf

    from rlrunner.recipe import ModelConfig

    def make(model_type: str) -> Any:
        cfg = OmegaConf.structured(ModelConfig(model_path=str(tiny_dirs(model_type)), model_type=model_type,
                                               precision="fp32", device="cpu"))
        cfg[model_type] = tiny_family_cfg(model_type)
        return cfg

    return make


@pytest.fixture(scope="session")
def family_recipe(tiny_dirs, tmp_path_factory) -> Callable[..., Any]:
    """``family_recipe(model_type, *overrides, algorithm="nft", path=None)``: the tiny CPU recipe turned into a
    :data:`FAMILY_RUN` of ``model_type`` on its tiny folder (or ``path``), loaded and validated as the launcher
    does; logs go under a session folder."""
    from rlrunner.recipe import load_recipe

    data = tmp_path_factory.mktemp("family_prompts")
    for split in ("train", "test"):
        (data / f"{split}.txt").write_text("".join(f'a sign that says "{w}"\n' for w in ("ab", "cd", "ef", "gh")))
    logs = tmp_path_factory.mktemp("family_logs")

    def make(model_type: str, *overrides: str, algorithm: str = "nft", path: str | Path | None = None):
        family = {**TINY_FAMILY_SETTINGS[model_type], "num_steps": 2, "eval_num_steps": 2, "lora_rank": 4,
                  "lora_alpha": 8, "train_sampler": "euler"}
        if algorithm == "flow_grpo" and "num_frames" in family:
            family["num_frames"] = 1  # FlowGRPO takes one advantage per sample: a video family trains on images
        video = family.get("num_frames", 1) > 1
        settings = [f"actor.model.{model_type}.{key}={value}".replace(" ", "") for key, value in family.items()]
        adv = ["algorithm.adv_type=grpo_video", "algorithm.advantage_mode=video"] if video else []
        folder = tiny_dirs(model_type) if path is None else path
        return load_recipe("tiny_nft_ocr", [
            *FAMILY_RUN, *settings, *adv, f"algorithm.name={algorithm}", f"actor.model.model_type={model_type}",
            f"actor.model.model_path={folder}", f"env.train.dataset.path={data}", f"env.eval.dataset.path={data}",
            f"runner.logger.log_path={logs}", *overrides])

    return make


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

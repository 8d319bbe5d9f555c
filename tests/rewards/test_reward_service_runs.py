"""Training runs against a real reward server process: the served rewards equal the local one step by step, and
a server that is down at start, or dies mid-run, is handled as ``reward.required`` says."""

from __future__ import annotations

from pathlib import Path

import pytest
from runner_helpers import SMALL_OVERRIDES, make_assets, train_metrics
from service_helpers import free_port, reward_server, stop

from rlrunner.commands.train import EXIT_REWARD_UNAVAILABLE, main
from rlrunner.rewards import installed_engines
from rlrunner.run.checkpoint import complete_checkpoints
from rlrunner.run.runner import Runner

pytestmark = [pytest.mark.slow, pytest.mark.skipif("rapidocr" not in installed_engines(), reason="needs rapidocr")]
ROOT = Path(__file__).resolve().parents[2]
# the tiny recipe's OCR settings, so the server scores as the local reward does
SERVER_ARGS = ("--engine", "rapidocr", "--set", "rec_only=true", "--set", "alphabet=23456789")
RUN = ["runner.val_before_train=false", "runner.val_check_interval=0", "runner.save_interval=1",
       "env.train.reward.engine=rapidocr", "env.train.reward.max_retries=0"]


def overrides(root: Path, *extra: str) -> list[str]:
    """The small CPU recipe (runner_helpers) on a random tiny model, logging under ``root``."""
    model, data = make_assets(root)
    return [*SMALL_OVERRIDES, *RUN, f"actor.model.model_path={model}", f"env.train.dataset.path={data}",
            f"env.eval.dataset.path={data}", f"runner.logger.log_path={root / 'logs'}", *extra]


def train(root: Path, recipe: str, options: list[str]) -> int:
    """``python -m rlrunner.commands.train`` in this process (so a test can act between steps); returns its exit code."""
    log_dir = root / "run"
    return main(["--config-name", recipe, "--log-dir", str(log_dir), *options])


def error_line(stderr: str) -> str:
    """The one error line the command printed (progress bars may be redrawn around it)."""
    lines = [line for line in stderr.splitlines() if line.startswith("rlrunner: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_remote_and_vlm_ocr_rewards_equal_the_local_ocr_reward_in_a_run(tmp_path):
    """One run, three parts scored on the same images: local ocr, remote and vlm_ocr against the server."""
    with reward_server(*SERVER_ARGS) as (url, _):
        options = overrides(
            tmp_path, "runner.max_steps=2", "env.train.reward.type=multi", f"env.train.reward.url={url}",
            f"env.train.reward.base_url={url}/v1", "env.train.reward.served_model=rlrunner-ocr",
            "env.train.reward.rec_only=true", "env.train.reward.alphabet='23456789'",
            "env.train.reward.rewards=[{model: ocr}, {model: remote}, {model: vlm_ocr}]",
            # the trained tiny model draws digits, so the OCR scores are not all 0
            f"actor.model.model_path={ROOT / 'examples/diffusion/models/tiny-ocr-flow'}",
            "actor.model.tiny.resolution=[32,96]", f"env.train.dataset.path={ROOT / 'examples/diffusion/data/tiny_ocr'}")
        assert train(tmp_path, "tiny_nft_ocr_remote", options) == 0
    metrics = train_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["env/ocr"] == m["env/remote"] == m["env/vlm_ocr"] and 0.2 < m["env/ocr"] < 1.0
        assert m["env/reward_errors"] == 0


@pytest.fixture
def kill_server_after_step_1(monkeypatch):
    """Kills the given server process right after the step-1 checkpoint is written."""
    process = {}
    save = Runner.save

    def save_then_kill(self: Runner) -> Path:
        path = save(self)
        if self.step == 1:
            stop(process["server"])
        return path

    monkeypatch.setattr(Runner, "save", save_then_kill)
    return process


@pytest.mark.parametrize("required", [False, True])
def test_a_server_killed_mid_run(tmp_path, capsys, kill_server_after_step_1, required):
    with reward_server(*SERVER_ARGS) as (url, process):
        kill_server_after_step_1["server"] = process
        options = overrides(tmp_path, "runner.max_steps=3", "runner.max_reward_error_steps=1",
                            "env.train.reward.model=remote", f"env.train.reward.url={url}",
                            f"env.train.reward.required={str(required).lower()}")
        code = train(tmp_path, "tiny_nft_ocr", options)
    run_dir = tmp_path / "run"
    metrics = train_metrics(run_dir)
    if not required:  # every failed sample scores 0 and is counted; the run finishes
        assert code == 0 and [m["step"] for m in metrics] == [1, 2, 3]
        assert metrics[0]["env/reward_errors"] == 0
        assert all(m["env/reward_errors"] == 8 and m["env/remote"] == 0.0 for m in metrics[1:])
        return
    # required: the first step without a single scored sample stops the run with one line; step 1's checkpoint stays
    assert code == EXIT_REWARD_UNAVAILABLE and [m["step"] for m in metrics] == [1]
    error = error_line(capsys.readouterr().err)
    assert error.startswith("rlrunner: error: no training sample could be scored in 1 step(s) in a row "
                            "(runner.max_reward_error_steps=1): reward service unavailable")
    assert f"{url}/score failed after 1 attempt(s): ConnectionError: [Errno 111] Connection refused" in error
    assert [p.name for p in complete_checkpoints(run_dir / "checkpoints")] == ["global_step_1"]


def test_a_required_server_down_at_start_stops_before_the_first_rollout(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    options = overrides(tmp_path, "runner.max_steps=1", "env.train.reward.model=remote", f"env.train.reward.url={url}")
    assert train(tmp_path, "tiny_nft_ocr", options) == EXIT_REWARD_UNAVAILABLE
    error = error_line(capsys.readouterr().err)
    assert error.startswith("rlrunner: error: env worker rank 0 on ")
    assert f"RewardUnavailable: reward.model=remote (required) cannot reach its service: {url}/health" in error
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # stopped while starting the workers

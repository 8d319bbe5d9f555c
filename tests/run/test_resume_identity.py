"""A run knows itself: runner.resume_dir=auto resumes only a checkpoint of the same experiment, made with the same
recipe (but for run length, logging and resume keys), found where the launcher writes ($RLRUNNER_LOG_ROOT)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from runner_helpers import SMALL_OVERRIDES, small_recipe, train_metrics
from shell_helpers import clean_env

from rlrunner.config.loader import to_yaml
from rlrunner.run.checkpoint import CheckpointError, save_checkpoint
from rlrunner.run.checkpointer import resume_point
from rlrunner.run.runner import run

ROOT = Path(__file__).resolve().parents[2]
NO_EVAL = ["runner.val_before_train=false", "runner.val_check_interval=0", "runner.save_interval=1"]


def _run(root: Path, name: str, *overrides: str) -> Path:
    log_dir = root / "logs" / name
    log_dir.mkdir(parents=True)
    run(small_recipe(root, *NO_EVAL, *overrides), log_dir)
    return log_dir


def _fake_checkpoint(root: Path, run_name: str, step: int, *overrides: str) -> Path:
    """A complete checkpoint whose config.yaml is the resolved recipe with ``overrides``."""
    cfg = small_recipe(root, *overrides)
    return save_checkpoint(root / "logs" / run_name / "checkpoints", step, runner_state={}, actor_state={},
                           config_yaml=to_yaml(cfg), model_info={}, write_adapters=lambda d: None)


def _recipe(root: Path, *overrides: str) -> dict:
    return OmegaConf.to_container(small_recipe(root, *overrides), resolve=True)


def test_auto_takes_the_newest_checkpoint_of_its_own_experiment(tmp_path):
    sweep_a = ("runner.logger.experiment_name=lr_a", "actor.optim.lr=1e-2")
    sweep_b = ("runner.logger.experiment_name=lr_b", "actor.optim.lr=1e-3")
    own_a = _fake_checkpoint(tmp_path, "20260101-000000-tiny_nft_ocr", 40, *sweep_a)
    own_b = _fake_checkpoint(tmp_path, "20260101-000001-tiny_nft_ocr", 20, *sweep_b)  # the newest of any run
    logs = tmp_path / "logs"
    assert resume_point("auto", logs, _recipe(tmp_path, *sweep_a, "runner.max_steps=80")) == own_a
    assert resume_point("auto", logs, _recipe(tmp_path, *sweep_b)) == own_b
    assert resume_point("auto", logs, _recipe(tmp_path, "runner.logger.experiment_name=lr_c")) is None


def test_auto_refuses_a_checkpoint_of_another_recipe_naming_the_keys_unless_allowed(tmp_path):
    _fake_checkpoint(tmp_path, "20260101-000000-tiny_nft_ocr", 3, "actor.optim.lr=1e-2", "algorithm.nft_beta=0.1")
    logs = tmp_path / "logs"
    changed = ("actor.optim.lr=1e-3", "algorithm.nft_beta=0.2")
    with pytest.raises(CheckpointError, match=r"^runner.resume_dir=auto: the newest checkpoint of experiment "
                                              r"'tiny_nft_ocr', .*global_step_3, was made with a different recipe: "
                                              r"actor.optim.lr \(0.01 -> 0.001\), algorithm.nft_beta \(0.1 -> 0.2\); "
                                              r"resume it anyway with runner.resume_allow_changes="
                                              r"\[actor.optim.lr,algorithm.nft_beta\] \(or true\)"):
        resume_point("auto", logs, _recipe(tmp_path, *changed))
    with pytest.raises(CheckpointError, match=r"recipe: algorithm.nft_beta \(0.1 -> 0.2\); "):
        resume_point("auto", logs, _recipe(tmp_path, *changed, "runner.resume_allow_changes=[actor.optim.lr]"))
    assert resume_point("auto", logs, _recipe(tmp_path, *changed, "runner.resume_allow_changes=true")) is not None
    # run length, logging, evaluation, checkpointing and placement may change on a relaunch
    free = ("actor.optim.lr=1e-2", "algorithm.nft_beta=0.1", "runner.max_steps=50", "runner.sample_log_interval=2", "runner.save_interval=7",
            "runner.val_check_interval=3", "cluster.worker_timeout_s=60")
    assert resume_point("auto", logs, _recipe(tmp_path, *free)) is not None


@pytest.mark.slow
def test_sweeps_relaunched_with_auto_each_resume_their_own_run(tmp_path):
    """The issue's lost work: two learning-rate sweeps of one recipe, relaunched after a preemption."""
    sweep_a = ("runner.logger.experiment_name=lr_a", "actor.optim.lr=1e-2")
    sweep_b = ("runner.logger.experiment_name=lr_b", "actor.optim.lr=2e-2")
    _run(tmp_path, "20260101-000000-tiny_nft_ocr", *sweep_a, "runner.max_steps=2")
    _run(tmp_path, "20260101-000001-tiny_nft_ocr", *sweep_b, "runner.max_steps=1")  # newer, fewer steps
    resumed_a = _run(tmp_path, "20260101-000002-tiny_nft_ocr", *sweep_a, "runner.max_steps=3", "runner.resume_dir=auto")
    resumed_b = _run(tmp_path, "20260101-000003-tiny_nft_ocr", *sweep_b, "runner.max_steps=2", "runner.resume_dir=auto")
    assert [m["step"] for m in train_metrics(resumed_a)] == [3]  # from lr_a's step 2, not lr_b's step 1
    assert [m["step"] for m in train_metrics(resumed_b)] == [2]
    # the same experiment name with another learning rate is refused before any step
    with pytest.raises(CheckpointError, match=r"different recipe: actor.optim.lr \(0.02 -> 0.03\);"):
        _run(tmp_path, "20260101-000004-tiny_nft_ocr", "runner.logger.experiment_name=lr_b", "actor.optim.lr=3e-2",
             "runner.max_steps=3", "runner.resume_dir=auto")


@pytest.mark.slow
def test_auto_finds_the_checkpoint_under_rlrunner_log_root_through_the_launcher(tmp_path):
    """run_diffusion.sh writes under $RLRUNNER_LOG_ROOT; a relaunch resumes from there, not from
    runner.logger.log_path (which the recipe points elsewhere)."""
    small_recipe(tmp_path)  # writes the tiny model and prompts
    log_root = tmp_path / "log_root"
    args = [*SMALL_OVERRIDES, *NO_EVAL, f"actor.model.model_path={tmp_path / 'model'}",
            f"env.train.dataset.path={tmp_path / 'data'}", f"env.eval.dataset.path={tmp_path / 'data'}",
            f"runner.logger.log_path={tmp_path / 'elsewhere'}", "runner.resume_dir=auto"]
    env = {**clean_env(), "PYTHON": sys.executable, "RLRUNNER_LOG_ROOT": str(log_root)}

    def launch(*more: str) -> tuple[int, str]:
        """Exit status and console output (the script sends the run's stderr to stdout, through tee)."""
        done = subprocess.run(["bash", str(ROOT / "examples/diffusion/run_diffusion.sh"), "tiny_nft_ocr", *args, *more],
                              check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        return done.returncode, done.stdout + done.stderr

    status, console = launch("runner.max_steps=1")
    assert status == 0, console[-3000:]
    assert "starting from scratch" in console
    (first_dir,) = log_root.iterdir()
    assert yaml.safe_load((first_dir / "config.yaml").read_text())["runner"]["log_dir"] == str(first_dir.resolve())
    status, console = launch("runner.max_steps=2")
    assert status == 0, console[-3000:]
    assert f"resumed from {first_dir.resolve() / 'checkpoints' / 'global_step_1'} at step 1" in console
    second_dir = max(log_root.iterdir())
    steps = [json.loads(line)["step"] for line in (second_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2] and not (tmp_path / "elsewhere").exists()


def test_an_explicit_resume_dir_with_another_rollout_context_parallel_degree_is_refused_in_one_line(tmp_path):
    """Every resume_dir form compares recipes as auto does: a checkpoint folder or a run folder rolled out in other
    rollout groups (rollout.context_parallel_size) would go on with other rollout noise."""
    ckpt = _fake_checkpoint(tmp_path, "20260101-000000-tiny_nft_ocr", 3)
    logs = tmp_path / "logs"
    recipe = _recipe(tmp_path)
    recipe["rollout"]["context_parallel_size"] = 2  # on the resolved recipe: the tiny denoiser has no CP plan
    for given in (str(ckpt), str(ckpt.parents[1])):
        with pytest.raises(CheckpointError) as err:
            resume_point(given, logs, recipe)
        assert str(err.value) == (
            f"runner.resume_dir={given!r}: checkpoint {ckpt} was made with a different recipe: "
            "rollout.context_parallel_size (1 -> 2); resume it anyway with "
            "runner.resume_allow_changes=[rollout.context_parallel_size] (or true)")
    recipe["runner"]["resume_allow_changes"] = ["rollout.context_parallel_size"]
    assert resume_point(str(ckpt), logs, recipe) == ckpt
    # the same recipe, relaunched with another length, placement and actor engine, resumes from an explicit path
    same = _recipe(tmp_path, "runner.max_steps=50", "cluster.worker_timeout_s=60", "actor.strategy=fsdp2")
    assert resume_point(str(ckpt.parents[1]), logs, same) == ckpt

"""The launcher end to end: run_diffusion.sh → python -m rlrunner.commands.train, as a user calls it."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from shell_helpers import ROOT, clean_env, run_handed_in_process
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlrunner.recipe import load_recipe

LAUNCHER = ROOT / "examples/diffusion/run_diffusion.sh"


def launch(*args: str, log_root: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**clean_env(), "PYTHON": sys.executable, "RLRUNNER_LOG_ROOT": str(log_root)}
    return subprocess.run(["bash", str(LAUNCHER), *args], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True,
                          timeout=timeout)


def launch_handing_in_process(*args: str, log_root: Path) -> subprocess.CompletedProcess:
    """:func:`launch` for a command that stops before training (a dry run, a refused recipe): the launcher runs, the
    Python command it hands over runs in this process."""
    env = {**clean_env(), "RLRUNNER_LOG_ROOT": str(log_root)}
    return run_handed_in_process(["bash", str(LAUNCHER), *args], env)


def test_dry_run_prints_the_resolved_recipe_and_creates_no_log_dir(tmp_path):
    result = launch_handing_in_process("tiny_nft_ocr", "actor.optim.lr=1e-4", "--dry-run", "runner.max_steps=3",
                                      log_root=tmp_path)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["actor"]["optim"]["lr"] == 1e-4 and resolved["runner"]["max_steps"] == 3
    assert "is valid (dry run" in result.stderr
    assert not any(tmp_path.iterdir())


def test_help_shows_the_launchers_usage_and_lists_recipes(tmp_path):
    result = launch("--help", log_root=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: bin/rlrunner train")
    recipes = sorted(p.stem for p in (ROOT / "examples/diffusion/config").glob("*.yaml"))
    listing = result.stdout.split("recipes:")[1].splitlines()
    listed = [line.strip() for line in listing if line.startswith("  ") and not line.startswith("   ")]
    assert listed == recipes
    # each description whole, from its first line to its last sentence
    description = " ".join(line.strip() for line in listing[listing.index("  tiny_awm_ocr") + 1:
                                                             listing.index("  tiny_nft_ocr")])
    assert description.startswith("The default recipe: AWM") and description.endswith("only smaller.")
    assert not any(tmp_path.iterdir())


def test_help_prints_whole_descriptions_with_their_indented_lines(tmp_path):
    # a description's indented lines (a list, a sentence's continuation) are part of it; only an example command ends it
    listing = launch("--help", log_root=tmp_path).stdout.split("recipes:")[1].splitlines()
    sd35 = listing[listing.index("  sd35_large_nft_ocr") + 1:listing.index("  sd3_nft_geneval")]
    assert sd35[-1].strip() == "actor.model.model_path=bench/model_configs/stable-diffusion-3.5-large)."
    flux1 = " ".join(line.strip() for line in listing[listing.index("  flux1_dev_nft_ocr") + 1:
                                                       listing.index("  flux2_klein_nft_ocr")])
    assert "[FF-NFT]" in flux1 and flux1.endswith("actor.model.model_path=bench/model_configs/flux.1-dev).")
    assert not any("run_diffusion.sh" in line for line in listing)


@pytest.mark.parametrize("flag", [["--config-name", "tiny_nft_ocr"], ["--config-name=tiny_nft_ocr"]])
def test_config_name_flag_names_the_run_after_that_recipe(tmp_path, flag):
    result = launch_handing_in_process(*flag, "--dry-run", log_root=tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.search(rf"a run would log to {re.escape(str(tmp_path))}/\d{{8}}-\d{{6}}-tiny_nft_ocr$", result.stderr,
                     re.MULTILINE), result.stderr
    assert yaml.safe_load(result.stdout)["algorithm"]["name"] == "nft"
    assert not any(tmp_path.iterdir())


def test_unknown_recipe_lists_available_ones(tmp_path):
    result = launch_handing_in_process("no_such_recipe", log_root=tmp_path)
    assert result.returncode == 2
    assert "no recipe named 'no_such_recipe'" in result.stderr
    assert "/config. Available recipes: flux1_dev_nft_ocr, " in result.stderr  # sorted
    assert "qwen_image_nft_ocr, " in result.stderr
    assert "tiny_nft_ocr" in result.stderr
    assert "Traceback" not in result.stderr
    assert not any(tmp_path.glob("*-no_such_recipe"))


def test_misspelt_key_fails_naming_it_and_leaves_no_log_folder(tmp_path):
    result = launch_handing_in_process("tiny_nft_ocr", "actor.optim.lrr=1", log_root=tmp_path)
    assert result.returncode == 2
    assert "actor.optim.lrr" in result.stderr and "did you mean 'actor.optim.lr'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir())  # the run never started: nothing to look at


def test_dry_run_before_the_recipe_name_prints_only_the_blocks_it_uses(tmp_path):
    result = launch_handing_in_process("--dry-run", "tiny_nft_ocr", "actor.optim.lr=1e-4", log_root=tmp_path)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["algorithm"]["name"] == "nft" and resolved["actor"]["optim"]["lr"] == 1e-4
    assert [k for k in resolved["actor"]["model"] if isinstance(resolved["actor"]["model"][k], dict)] == ["tiny"]
    assert not [k for k in resolved["algorithm"] if k.startswith(("awm_", "flow_grpo_"))]
    assert {"nft_beta", "nft_tau"} <= set(resolved["algorithm"])
    whole = OmegaConf.to_yaml(load_recipe("tiny_nft_ocr", ["actor.optim.lr=1e-4"]), resolve=True)
    assert len(result.stdout.splitlines()) < len(whole.splitlines()) / 2  # 186 of 455 lines (every family, algorithm)
    assert not any(tmp_path.iterdir())


def test_python_entry_point_dry_run_starts_nothing(tmp_path):
    result = subprocess.run([sys.executable, "-m", "rlrunner.commands.train", "--dry-run", "--config-name", "tiny_nft_ocr",
                             f"runner.logger.log_path={tmp_path}"], check=False, cwd=ROOT, capture_output=True,
                            text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["actor"]["model"]["model_type"] == "tiny"
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_default_recipe_runs_end_to_end_shortened(tmp_path):
    """No config name: the CPU recipe (shipped tiny model, real OCR reward), a few steps and prompts."""
    result = launch("runner.max_steps=2", "env.train.total_num_envs=16", "actor.global_batch_size=16",
                    "env.eval.total_num_envs=8", "runner.val_check_interval=1", "runner.sample_log_interval=1",
                    log_root=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.endswith("-tiny_awm_ocr")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/avg" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert all(0.0 <= r["eval/avg"] <= 1.0 and "eval/ocr" in r for r in evals)
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert {"train/samples", "eval/samples"} <= set(events.Tags()["images"])
    assert (run_dir / "checkpoints" / "global_step_2" / "adapter" / "pytorch_lora_weights.safetensors").is_file()
    console = (run_dir / "console.log").read_text()
    assert "eval reward" in console
    # the first run reads well: progress as lines (no carriage-return redraws), no warning to look up, a summary
    assert "\r" not in console
    assert "[step 0] eval: 8 held-out prompts, one sample each" in console
    assert "[step 1/2] reward " in console and "[step 2/2] reward " in console
    assert not [line for line in console.splitlines() if "warn" in line.lower() or "[transformers]" in line]
    summary = console[console.index("rlrunner: done: 2 step(s) in "):].splitlines()
    assert summary[1].startswith("  held-out reward: ") and " at step 0 -> " in summary[1]
    assert summary[2] == f"  TensorBoard:     bin/rlrunner tensorboard --logdir {run_dir / 'tensorboard'}"
    assert summary[3] == f"  checkpoints:     {run_dir / 'checkpoints'}"
    export = summary[4].removeprefix("  export the LoRA: ")
    assert export == f"bin/rlrunner export {run_dir / 'checkpoints' / 'global_step_2'} --out {run_dir / 'lora'}"
    # as printed, in a fresh shell: no virtualenv active or on PATH
    exported = subprocess.run(["bash", "-c", export], check=False, cwd=ROOT, env=clean_env(), capture_output=True,
                              text=True, timeout=120)
    assert exported.returncode == 0, exported.stderr
    assert (run_dir / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert console.startswith(f"rlrunner: logging to {run_dir}\n")  # the run's first line is in its log
    command = (run_dir / "command.txt").read_text().splitlines()
    assert command[0].startswith("bash ") and command[0].endswith("run_diffusion.sh runner.max_steps=2 "
                                                                  "env.train.total_num_envs=16 "
                                                                  "actor.global_batch_size=16 "
                                                                  "env.eval.total_num_envs=8 "
                                                                  "runner.val_check_interval=1 "
                                                                  "runner.sample_log_interval=1")
    assert command[1] == "# recipe: tiny_awm_ocr"


LEARNING_STEPS = 40
# Held-out gain at LEARNING_STEPS, seeds 42 / 1 / 2 (bench/algorithms.py, docs/benchmarks.md "The CPU recipe"): the
# default recipe, and the same recipe trained on shuffled rewards (`algorithm.reward_signal=shuffle`, variant
# awm_shuffle).
GAINS_MEASURED = (0.068, 0.033, 0.036)
SHUFFLED_GAINS_MEASURED = (-0.268, -0.140, -0.050)
# The test runs seed 42 and asks for half the smallest of each: the gap over the control (0.336 / 0.173 / 0.086),
# and the gain itself, so that a control that collapses cannot pass a loop that does not learn.
MARGIN = min(g - s for g, s in zip(GAINS_MEASURED, SHUFFLED_GAINS_MEASURED, strict=True)) / 2
MIN_GAIN = min(GAINS_MEASURED) / 2


def held_out_curve(run_root: Path) -> dict[int, float]:
    (run_dir,) = run_root.iterdir()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/avg"] for r in records if "eval/avg" in r}


@pytest.mark.slow
@pytest.mark.longest
def test_the_default_recipe_learns_from_its_reward(tmp_path):
    """The default recipe, as a fresh clone runs it, gains more held-out OCR reward (128 prompts, fixed noise) in its
    first LEARNING_STEPS steps than the same recipe trained on shuffled rewards, by at least MARGIN, and at least
    MIN_GAIN (above the eval's step-to-step jitter, about ±0.01). Both runs go at once, one torch thread each on the
    2 cores (about 7.5 minutes on a quiet machine). The control skips its step-0 eval: it starts from the same
    adapters and evaluates the same prompts with the same noise, so that eval would repeat the first run's."""
    steps = [f"runner.max_steps={LEARNING_STEPS}", f"runner.val_check_interval={LEARNING_STEPS}",
             "runner.save_interval=0", "runner.sample_log_interval=0"]
    env = {**clean_env(), "PYTHON": sys.executable}
    runs = {name: subprocess.Popen(["bash", str(LAUNCHER), *steps, *extra], cwd=ROOT, text=True,
                                   env={**env, "RLRUNNER_LOG_ROOT": str(tmp_path / name)},
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for name, extra in (("reward", []),
                                ("shuffled", ["algorithm.reward_signal=shuffle", "runner.val_before_train=false"]))}
    for name, run in runs.items():
        output, _ = run.communicate(timeout=2400)  # a hang guard: 16 minutes beside another test process here
        assert run.returncode == 0, (name, output[-3000:])
    curves = {name: held_out_curve(tmp_path / name) for name in runs}
    assert sorted(curves["reward"]) == [0, LEARNING_STEPS] and sorted(curves["shuffled"]) == [LEARNING_STEPS], curves
    gains = {name: curve[LEARNING_STEPS] - curves["reward"][0] for name, curve in curves.items()}
    assert gains["reward"] - gains["shuffled"] >= MARGIN, gains
    assert gains["reward"] >= MIN_GAIN, gains
    # the honest run, as shipped, never sets off the reward-hacking watch (issue 43): watch/alarm is 0 at every eval
    (run_dir,) = (tmp_path / "reward").iterdir()
    alarms = {r["step"]: r["watch/alarm"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if "eval/avg" in r}
    assert alarms == {0: 0.0, LEARNING_STEPS: 0.0}, alarms


def test_every_command_the_readme_prints_goes_through_the_projects_environment():
    """In a fresh shell `python` lacks torch and `tensorboard` is not on PATH: README's commands are the launcher, the
    test script or bin/rlrunner, and each bin/rlrunner subcommand it shows starts there (``--help``)."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|text)\n(.*?)```", readme, re.DOTALL)
    commands = [line.removeprefix("$ ").strip() for block in blocks for line in block.splitlines()
                if line.strip() and not line.startswith((" ", "#"))]
    commands += re.findall(r"`((?:python|tensorboard|bin/rlrunner) [^`]*)`", readme)
    bare = [c for c in commands if c.split()[0] in ("python", "python3", "tensorboard", "ray")]
    assert not bare, f"these fail in a fresh shell; use bin/rlrunner: {bare}"
    subcommands = sorted({c.split()[1] for c in commands if c.startswith("bin/rlrunner ")})
    assert {"export", "plan", "tensorboard", "train"} <= set(subcommands)
    for sub in subcommands:
        args = ["-c", "import torch, rlrunner"] if sub == "python" else ["--help"]
        done = subprocess.run([str(ROOT / "bin/rlrunner"), sub, *args], cwd=ROOT, env=clean_env(),
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, (sub, done.stderr[-2000:])

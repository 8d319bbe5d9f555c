"""Every local path of a loaded recipe is absolute (anchored at the driver's working directory); hub ids and
``auto`` stay as they are, so a worker in another folder on another node reads the same files."""

from pathlib import Path

from rlrunner.config.checks import KEY_CHECKS, ExistingPath
from rlrunner.config.paths import MODEL_KEYS, PATH_KEYS
from tests.config.test_loader import load


def test_relative_paths_are_anchored_at_the_working_directory(recipe_dir, tmp_path: Path):
    (tmp_path / "lora").mkdir()
    (tmp_path / "token").write_text("secret\n")
    cfg = load(recipe_dir, "actor.model.model_path=./model", "actor.model.tiny.lora_path=lora",
               "env.train.dataset.path=data", "env.eval.dataset.path=../" + tmp_path.name + "/data",
               "runner.logger.log_path=runs", "env.train.video_cfg.video_base_dir=~/videos",
               "runner.resume_dir=auto", "env.train.reward.model=remote", "env.train.reward.url=http://127.0.0.1:1",
               "env.train.reward.token_file=token")
    assert cfg.actor.model.model_path == str(tmp_path / "model")
    assert cfg.actor.model.tiny.lora_path == str(tmp_path / "lora")
    assert cfg.env.train.dataset.path == cfg.env.eval.dataset.path == str(tmp_path / "data")
    assert cfg.runner.logger.log_path == str(tmp_path / "runs")
    assert cfg.env.train.video_cfg.video_base_dir == str(Path.home() / "videos")
    assert cfg.env.train.reward.token_file == str(tmp_path / "token")
    assert cfg.runner.resume_dir == "auto" and cfg.env.eval.video_cfg.video_base_dir == ""  # unset stays unset


def test_a_hub_id_is_not_a_path(recipe_dir):
    assert load(recipe_dir, "actor.model.model_path=org/model").actor.model.model_path == "org/model"


def test_multi_reward_parts_get_absolute_files(recipe_dir, tmp_path: Path):
    (tmp_path / "key").write_text("k\n")
    part = "{model: vlm_ocr, base_url: 'http://127.0.0.1:1/v1', served_model: m, api_key_file: key}"
    cfg = load(recipe_dir, "env.train.reward.type=multi", f"env.train.reward.rewards=[{part}]")
    assert cfg.env.train.reward.rewards[0].api_key_file == str(tmp_path / "key")


def test_every_key_checked_as_an_existing_path_is_made_absolute():
    existing = {key for key, check in KEY_CHECKS.items() if isinstance(check, ExistingPath)}
    assert existing <= set(PATH_KEYS) | set(MODEL_KEYS)

"""Every local path of a loaded recipe is absolute; hub ids and ``auto`` stay as they are, so a worker in another
folder on another node reads the same files. A relative path is taken from the folder the command was typed in
(the launcher says where: ``RLRUNNER_CALLER_CWD``), else from the checkout (the shipped recipes' paths), else it is
an error naming both; a node's path of a run that joins a cluster is only a warning on the driver."""

import logging
from pathlib import Path

import pytest

from rlrunner.config.errors import RecipeError
from rlrunner.config.paths import REPO_DIR
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


def test_relative_paths_resolve_from_the_folder_the_command_was_typed_in_not_the_checkout(recipe_dir, tmp_path,
                                                                                           monkeypatch):
    """``env.train.dataset.path=mydata`` typed in ~/exp reads ~/exp/mydata, although the launcher runs in the
    checkout."""
    exp = tmp_path / "exp"
    (exp / "mydata").mkdir(parents=True)
    (exp / "mydata" / "train.txt").write_text('a sign that says "1"\n')
    monkeypatch.chdir(REPO_DIR)  # as examples/diffusion/run_diffusion.sh does, after recording where the user was
    monkeypatch.setenv("RLRUNNER_CALLER_CWD", str(exp))
    assert load(recipe_dir, "env.train.dataset.path=mydata").env.train.dataset.path == str(exp / "mydata")


def test_the_shipped_recipes_repository_paths_work_from_any_folder(recipe_dir, monkeypatch):
    monkeypatch.delenv("RLRUNNER_CALLER_CWD", raising=False)  # recipe_dir made tmp_path the working directory
    cfg = load(recipe_dir, "env.train.dataset.path=examples/diffusion/data/tiny_ocr",
               "actor.model.model_path=examples/diffusion/models/tiny-ocr-flow")
    assert cfg.env.train.dataset.path == str(REPO_DIR / "examples/diffusion/data/tiny_ocr")
    assert cfg.actor.model.model_path == str(REPO_DIR / "examples/diffusion/models/tiny-ocr-flow")


def test_a_relative_path_in_neither_place_is_an_error_naming_both(recipe_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("RLRUNNER_CALLER_CWD", raising=False)
    with pytest.raises(RecipeError) as err:
        load(recipe_dir, "env.train.dataset.path=mydata")
    assert str(err.value) == (f"env.train.dataset.path='mydata' does not exist (tried {tmp_path / 'mydata'} and "
                              f"{REPO_DIR / 'mydata'}); give an existing file or folder or ''")


def test_a_missing_model_folder_beside_its_parent_folder_is_an_error_not_a_download(recipe_dir, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.delenv("RLRUNNER_CALLER_CWD", raising=False)
    (tmp_path / "models").mkdir()  # models/sd3 is a folder that is not there, not the hub id of org "models"
    with pytest.raises(RecipeError, match=rf"^actor.model.model_path='models/sd3' does not exist \(tried "
                                          rf"{tmp_path / 'models/sd3'} and "):
        load(recipe_dir, "actor.model.model_path=models/sd3")
    with pytest.raises(RecipeError, match=r"^env.train.reward.rewards\[0\].model_path='models/clip' does not exist"):
        load(recipe_dir, "env.train.reward.type=multi", "env.train.reward.rewards=[{model: pickscore, "
                                                        "model_path: models/clip}]")
    assert load(recipe_dir, "actor.model.model_path=stabilityai/sd3").actor.model.model_path == "stabilityai/sd3"


JOINED = ["cluster.backend=ray", "cluster.ray_address=127.0.0.1:6379"]
ON_THE_NODES = ["actor.model.model_path=/gpu-nodes/models/sd3", "env.train.reward.model=remote",
                "env.train.reward.url=http://127.0.0.1:1", "env.train.reward.token_file=/gpu-nodes/token"]


def test_a_run_that_joins_a_cluster_leaves_the_nodes_paths_to_the_nodes(recipe_dir, monkeypatch, caplog):
    """The driver never loads the model nor reads a reward's files: on a cluster, only the nodes need them."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(RecipeError, match=r"^actor.model.model_path='/gpu-nodes/models/sd3' does not exist; give"):
        load(recipe_dir, ON_THE_NODES[0])  # a run on this machine: the driver's machine is the node
    with pytest.raises(RecipeError, match=r"^env.train.reward.token_file='/gpu-nodes/token' does not exist; give"):
        load(recipe_dir, *ON_THE_NODES[1:])
    with caplog.at_level(logging.WARNING, logger="rlrunner"):
        cfg = load(recipe_dir, *ON_THE_NODES, *JOINED)
    assert cfg.actor.model.model_path == "/gpu-nodes/models/sd3" and cfg.env.train.reward.token_file == "/gpu-nodes/token"
    assert "actor.model.model_path='/gpu-nodes/models/sd3' does not exist on this machine; the run joins a " \
           "cluster, so each node that reads it checks it there" in caplog.text
    assert "env.train.reward.token_file='/gpu-nodes/token' does not exist on this machine" in caplog.text
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # joining by the environment, as `ray job submit` does
    assert load(recipe_dir, *ON_THE_NODES, "cluster.backend=ray").actor.model.model_path == "/gpu-nodes/models/sd3"
    with pytest.raises(RecipeError, match=r"^env.train.dataset.path='/gpu-nodes/data' does not exist"):
        load(recipe_dir, *ON_THE_NODES, *JOINED, "env.train.dataset.path=/gpu-nodes/data")  # the driver reads it

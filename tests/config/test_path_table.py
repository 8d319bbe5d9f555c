"""One table says, for every path key, what it names and where it is checked; the key checks, the driver's
resolution and each worker's node check all read it, so a new path key is one edit, and the env (reward) workers'
files are checked on their node with the same one line as the actor's model folder."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlrunner.cluster.ray_host import WorkerHost
from rlrunner.cluster.shipping import NodeSetupError
from rlrunner.config.check_kinds import InPathTable
from rlrunner.config.checks import leaves
from rlrunner.config.paths import PATH_KEYS, path_key
from rlrunner.recipe import KEY_CHECKS, RecipeConfig
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.reward import RewardWorker, reward_settings
from rlrunner.workers.rollout import RolloutWorker
from tests.config.test_loader import load


def test_the_key_checks_send_exactly_the_tables_keys_to_it():
    in_table = {key for key, check in KEY_CHECKS.items() if isinstance(check, InPathTable)}
    assert in_table == set(PATH_KEYS)


def test_every_key_named_like_a_path_is_in_the_table():
    """A new ``..._path``, ``..._file`` or ``..._dir`` key cannot ship without saying where it is checked."""
    for dotted, _ in leaves(OmegaConf.structured(RecipeConfig)):
        if dotted.rsplit(".", 1)[-1].endswith(("path", "_file", "_dir")):
            assert path_key(dotted) is not None, dotted
    assert path_key("env.eval.reward.rewards[3].api_key_file") == PATH_KEYS["env.<split>.reward.api_key_file"]
    assert path_key("actor.model.sd3.lora_path").readers == ("actor", "rollout")


def test_each_worker_checks_on_its_node_the_paths_it_reads(recipe_dir, tmp_path: Path):
    for name in ("token", "key", "head.pth", "lora"):
        (tmp_path / name).mkdir() if name == "lora" else (tmp_path / name).write_text("x")
    part = "{model: vlm_ocr, base_url: 'http://127.0.0.1:1/v1', served_model: m, api_key_file: key}"
    cfg = load(recipe_dir, "actor.model.tiny.lora_path=lora", "env.train.reward.type=multi",
               f"env.train.reward.rewards=[{part}]", "env.eval.reward.model=remote",
               "env.eval.reward.url=http://127.0.0.1:1", "env.eval.reward.token_file=token",
               "env.eval.reward.head_path=head.pth", "env.eval.reward.processor_path=org/processor")
    model = {"actor.model.model_path": str(tmp_path / "model"), "actor.model.tiny.lora_path": str(tmp_path / "lora")}
    assert ActorWorker.node_paths(cfg.actor, cfg.algorithm, 1) == model
    assert RolloutWorker.node_paths(cfg.actor.model, 0) == model
    assert RewardWorker.node_paths(reward_settings(cfg.env)) == {  # a hub id (processor_path) is no local path
        "env.train.reward.rewards[0].api_key_file": str(tmp_path / "key"),
        "env.eval.reward.head_path": str(tmp_path / "head.pth"),
        "env.eval.reward.token_file": str(tmp_path / "token")}


def test_an_env_workers_file_missing_on_its_node_fails_before_the_reward_is_built(recipe_dir, tmp_path: Path):
    (tmp_path / "token").write_text("secret\n")
    cfg = load(recipe_dir, "env.train.reward.model=remote", "env.train.reward.url=http://127.0.0.1:1",
               "env.train.reward.token_file=token")
    (tmp_path / "token").unlink()  # on the driver's disk at load time, not on the node that starts the worker
    with pytest.raises(NodeSetupError) as err:
        WorkerHost().construct({"RANK": "0", "WORLD_SIZE": "1"}, RewardWorker, (reward_settings(cfg.env),), {})
    assert str(err.value) == (f"cannot read env.train.reward.token_file={str(tmp_path / 'token')!r} (the file is on "
                              "the driver's disk, not on this node); put it in a folder every node mounts at the same "
                              "path")

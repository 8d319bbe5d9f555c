"""Recipe loading: overrides, interpolation, and every class of user error with its message."""

from pathlib import Path

import pytest
import yaml

from rlrunner.config.loader import RecipeError, available_recipes
from rlrunner.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]


def load(config_dir: Path, *overrides: str, name: str = "base"):
    return load_recipe(name, list(overrides), config_dir=config_dir)


def write_recipe(config_dir: Path, name: str, edit) -> None:
    recipe = yaml.safe_load((config_dir / "base.yaml").read_text())
    edit(recipe)
    (config_dir / f"{name}.yaml").write_text(yaml.safe_dump(recipe))


def test_recipe_values_and_schema_defaults(recipe_dir):
    cfg = load(recipe_dir)
    assert cfg.algorithm.group_size == 8
    assert cfg.actor.model.model_type == "tiny"
    assert cfg.actor.optim.adam_beta2 == 0.999  # not in the recipe: schema default
    assert list(cfg.actor.model.tiny.resolution) == [32, 96]


def test_dotted_overrides_scalars_and_lists(recipe_dir):
    cfg = load(recipe_dir, "actor.optim.lr=1e-4", "algorithm.nft_tau=[1.0,0.01,0,70]", "runner.max_steps=3")
    assert cfg.actor.optim.lr == pytest.approx(1e-4)
    assert list(cfg.algorithm.nft_tau) == [1.0, 0.01, 0, 70]
    assert cfg.runner.max_steps == 3


def test_interpolation_is_resolved(recipe_dir):
    write_recipe(recipe_dir, "interp", lambda r: r["env"]["eval"].update(total_num_envs="${algorithm.group_size}"))
    assert load(recipe_dir, name="interp").env.eval.total_num_envs == 8


def test_misspelt_key_names_it_and_suggests(recipe_dir):
    write_recipe(recipe_dir, "typo", lambda r: r["actor"]["optim"].update(lrr=1))
    with pytest.raises(RecipeError, match=r"unknown key 'actor.optim.lrr'.*did you mean 'actor.optim.lr'"):
        load(recipe_dir, name="typo")


def test_misspelt_override_key(recipe_dir):
    with pytest.raises(RecipeError, match=r"command-line override: unknown key 'algorithm.nft_betta'.*nft_beta"):
        load(recipe_dir, "algorithm.nft_betta=0.2")


def test_unknown_section_lists_valid_keys(recipe_dir):
    write_recipe(recipe_dir, "section", lambda r: r.update(trainer={"x": 1}))
    with pytest.raises(RecipeError, match=r"unknown key 'trainer'"):
        load(recipe_dir, name="section")


def test_wrong_type_names_key_value_and_type(recipe_dir):
    with pytest.raises(RecipeError, match=r"'actor.micro_batch_size' has value 'four'.*expected int"):
        load(recipe_dir, "actor.micro_batch_size=four")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor.global_batch_size=60"], r"actor.global_batch_size=60 is not divisible by actor.micro_batch_size=16"),
        (["env.train.total_num_envs=60"], r"total_num_envs=60 is not a multiple of algorithm.group_size=8"),
        (["algorithm.nft_tau=[1.0,0.1,5]"], r"algorithm.nft_tau=.* must be a number in \(0, 1\] or \[start, end"),
        (["algorithm.nft_tau=fast"], r"algorithm.nft_tau='fast'"),
        (["cluster.component_placement={actor: all, rollout: all, env: all, critic: all}"], r"critic"),
        (["actor.model.model_path=/no/such/model"], r"model_path='/no/such/model' does not exist"),
        (["actor.model.model_path=''"], r"model_path is empty"),
        (["env.train.dataset.path=/no/such/dir"], r"env.train.dataset.path='/no/such/dir' does not exist"),
        (["env.eval.dataset.split=valid"], r"has no valid.txt"),
        (["algorithm.nft_weight_mode=adaptiv"], r"nft_weight_mode='adaptiv' is not valid \(did you mean 'adaptive'"),
        (["actor.model.model_type=sd4"], r"model_type='sd4' is not valid"),
        (["actor.model.tiny.train_sampler=heun"], r"train_sampler='heun' is not valid"),
        (["actor.strategy=fsdp"], r"actor.strategy='fsdp' is not valid \(did you mean 'fsdp2'\?\); choose .*'ddp'"),
        (["actor.model.tiny.num_frames=4"], r"num_frames=4 must be 4k\+1"),
        (["runner.max_steps=-1"], r"runner.max_steps or runner.max_epochs"),
        (["algorithm.nft_timesteps_per_sample=0"], r"algorithm.nft_timesteps_per_sample=0 must be a number >= 1"),
        (["env.eval.reward.model=remot"], r"env.eval.reward.model='remot' is not valid \(did you mean 'remote'"),
        (["env.train.reward.model=remote"], r"env.train.reward.url is empty; reward.model=remote needs it"),
        (["env.train.reward.model=remote", "env.train.reward.url=127.0.0.1:8000"],
         r"env.train.reward.url='127.0.0.1:8000' must be an http\(s\) URL"),
        (["env.train.reward.model=remote", "env.train.reward.url=http://h:1", "env.train.reward.token_file=no.key"],
         r"env.train.reward.token_file='no.key' does not exist"),
        (["env.train.reward.type=multi", "env.train.reward.rewards=[{model: ocr}, {model: vlm_ocr}]"],
         r"env.train.reward.rewards\[1\].base_url is empty; reward.model=vlm_ocr needs it"),
        (["env.train.reward.timeout_s=0"], r"env.train.reward.timeout_s=0.0 must be a number > 0"),
        (["env.train.reward.max_concurrency=0"], r"env.train.reward.max_concurrency=0 must be a number >= 1"),
        (["runner.max_reward_error_steps=0"], r"runner.max_reward_error_steps=0 must be a number >= 1"),
    ],
)
def test_contradictions_are_rejected_with_one_line(recipe_dir, overrides, message):
    with pytest.raises(RecipeError, match=message) as info:
        load(recipe_dir, *overrides)
    assert "\n" not in str(info.value)


def test_a_joined_ray_cluster_defers_device_checks_to_its_own_nodes(recipe_dir, monkeypatch):
    """The driver machine's devices say nothing about a cluster it joins; the run checks the cluster's nodes."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # this driver: one CPU "device"
    monkeypatch.setattr("rlrunner.cluster.resources.npu_available", lambda: False)
    eight = ["cluster.backend=ray", "cluster.component_placement={actor: 0-3, rollout: 4-5, env: 6-7}"]
    with pytest.raises(RecipeError, match=r"reaches device 3, but the cluster has 1 device"):
        load(recipe_dir, *eight, "cluster.num_devices_per_node=1")  # counted offline, with or without Ray
    with pytest.raises(RecipeError, match=r"reaches device 3, but the cluster has 1 device"):
        load(recipe_dir, *eight, "cluster.num_devices_per_node=1", "cluster.ray_address=10.0.0.1:6379")
    assert load(recipe_dir, *eight, "cluster.ray_address=10.0.0.1:6379").cluster.num_devices_per_node == 0
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert load(recipe_dir, *eight).cluster.backend == "ray"
    with pytest.raises(RecipeError, match=r"reaches device 3"):
        load(recipe_dir, *eight[1:], "cluster.backend=local")  # in-process workers run on this machine


def test_hub_id_model_path_is_accepted_without_local_folder(recipe_dir):
    assert load(recipe_dir, "actor.model.model_path=org/model").actor.model.model_path == "org/model"


def test_unknown_recipe_lists_available(recipe_dir):
    with pytest.raises(RecipeError, match=r"no recipe named 'bsae'.*did you mean 'base'.*Available recipes: base"):
        load(recipe_dir, name="bsae")


@pytest.mark.parametrize("name", available_recipes())
def test_shipped_recipes_are_valid(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    overrides = []
    train_dir = ROOT / load_recipe_yaml(name)["env"]["train"]["dataset"]["path"]
    if not (train_dir / "train.txt").exists():
        # the GPU recipes' upstream train split is not shipped: the error must say so and where to get it
        with pytest.raises(RecipeError, match=r"has no train.txt.*SOURCE.md says where to get it"):
            load_recipe(name, [])
        overrides = ["env.train.dataset.split=test"]
    cfg = load_recipe(name, overrides)
    assert cfg.actor.model.model_path


def load_recipe_yaml(name: str) -> dict:
    return yaml.safe_load((ROOT / "examples/diffusion/config" / f"{name}.yaml").read_text())


def test_hydra_plus_prefixes_set_a_schema_key(recipe_dir):
    # +key adds a key in hydra; every key is in our schema, so it is plain assignment (as ++key, set-or-add)
    cfg = load(recipe_dir, "+runner.val_check_interval=5", "++actor.optim.lr=2e-4")
    assert cfg.runner.val_check_interval == 5
    assert cfg.actor.optim.lr == pytest.approx(2e-4)


def test_hydra_plus_prefix_on_an_unknown_key_names_the_key_without_the_plus(recipe_dir):
    with pytest.raises(RecipeError, match=r"unknown key 'runner\.val_check_intervl' \(did you mean "
                                          r"'runner\.val_check_interval'\?\)"):
        load(recipe_dir, "+runner.val_check_intervl=5")

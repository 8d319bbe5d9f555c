"""Every schema key has a check, held by the component that reads it, and representative bad values are rejected
with one line naming key, value and what is allowed (before any model loads)."""

import ast
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlrunner.config.checks import family_sections, leaves, table_key
from rlrunner.config.errors import RecipeError
from rlrunner.config.loader import RecipeError as ReexportedRecipeError
from rlrunner.recipe import KEY_CHECKS, KEY_TABLES, RecipeConfig
from tests.config.test_loader import load, write_recipe


def test_every_schema_leaf_has_a_check_and_every_check_a_leaf():
    schema = OmegaConf.structured(RecipeConfig)
    families = family_sections(schema)
    assert {"tiny", "sd3", "wan22_ti2v_5b", "qwen_image"} <= set(families)
    keys = {table_key(dotted, families) for dotted, _ in leaves(schema)}
    assert sorted(keys - set(KEY_CHECKS)) == [], "schema keys without a check in any table"
    assert sorted(set(KEY_CHECKS) - keys) == [], "KEY_CHECKS entries for keys the schema no longer has"
    assert "env.<split>.reward.engine" in keys and "actor.model.<family>.lora_path" in keys  # the walk goes deep


# which component reads the keys under each prefix; a key belongs to its longest matching prefix
OWNERS = {
    "cluster.": "cluster", "actor.strategy": "distributed", "actor.one_rank_group": "distributed",
    "actor.context_parallel_": "distributed", "rollout.context_parallel_size": "distributed",
    "runner.": "run", "env.<split>.video_cfg.": "run",
    "runner.logger.": "tracking",
    "algorithm.": "objectives",
    "env.<split>.dataset.": "data", "env.<split>.total_num_envs": "data", "env.<split>.rollout_epoch": "data",
    "env.<split>.reward.": "rewards",
    "actor.micro_batch_size": "workers", "actor.global_batch_size": "workers", "actor.seed": "workers",
    "actor.optim.": "workers",
    "actor.model.": "models",
}


def _owner(key: str) -> str | None:
    prefixes = [prefix for prefix in OWNERS if key.startswith(prefix)]
    return OWNERS[max(prefixes, key=len)] if prefixes else None


def test_each_table_holds_only_the_keys_of_its_components_prefixes():
    wrong = {key: (component, _owner(key)) for component, table in KEY_TABLES.items() for key in table
             if _owner(key) != component}
    assert wrong == {}, "key: (the table holding it, the component that reads it)"
    assert set(KEY_TABLES) == set(OWNERS.values())


def test_every_schema_leaf_has_exactly_one_entry_over_all_tables():
    schema = OmegaConf.structured(RecipeConfig)
    families = family_sections(schema)
    keys = {table_key(dotted, families) for dotted, _ in leaves(schema)}
    counts = Counter(key for table in KEY_TABLES.values() for key in table)
    assert {key: n for key, n in counts.items() if n > 1} == {}, "keys checked by two components"
    assert set(counts) == keys == set(KEY_CHECKS)


def _packages_imported(folder: Path) -> set[str]:
    """The ``rlrunner`` packages the modules of ``folder`` import anywhere (lazy imports inside functions too)."""
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
                if node.module == "rlrunner":  # from rlrunner import models
                    found.update(f"rlrunner.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return {".".join(name.split(".")[:2]) for name in found if name.startswith("rlrunner.")}


def test_the_recipe_package_imports_none_of_the_components_it_configures():
    """rlrunner/config holds the check machinery; each component checks its own keys, so config imports none."""
    imported = _packages_imported(Path(__file__).resolve().parents[2] / "rlrunner" / "config")
    components = {"models", "rewards", "cluster", "data", "objectives", "algorithms", "tracking", "recipe"}
    assert imported & {f"rlrunner.{name}" for name in components} == set()


def test_recipe_error_lives_in_its_own_module():
    assert ReexportedRecipeError is RecipeError


@pytest.mark.parametrize(("override", "message"), [
    # registries, train and eval
    ("env.train.reward.model=ocrr", "env.train.reward.model='ocrr' is not valid (did you mean 'ocr'?); choose one"),
    ("env.eval.reward.engine=tesseract", "env.eval.reward.engine='tesseract' is not valid; choose one of ['auto'"),
    ("env.train.reward.ocr_version=PP-OCRv3",
     "env.train.reward.ocr_version='PP-OCRv3' is not valid (did you mean 'PP-OCRv5'?); choose one of ['PP-OCRv4', 'PP-OCRv5']"),
    ("actor.model.tiny.train_sampler=dpm3", "actor.model.tiny.train_sampler='dpm3' is not valid"),
    ("algorithm.nft_weight_mode=adaptiv", "(did you mean 'adaptive'?)"),
    ("runner.logger.logger_backends=[wandbb]", "has item 'wandbb' that is not valid (did you mean 'wandb'?)"),
    # numeric ranges that would divide by zero, loop forever or diverge
    ("runner.weight_sync_interval=0", "runner.weight_sync_interval=0 must be a number >= 1"),
    ("actor.optim.adam_beta2=1.0", "actor.optim.adam_beta2=1.0 must be a number >= 0 and < 1"),
    ("actor.optim.lr=0", "actor.optim.lr=0.0 must be a number > 0"),
    ("actor.optim.clip_grad=-1", "actor.optim.clip_grad=-1.0 must be a number > 0 (max gradient norm)"),
    ("algorithm.group_size=1", "algorithm.group_size=1 must be a number >= 2"),
    ("algorithm.nft_tau=1.5", "algorithm.nft_tau=1.5 must be a number in (0, 1]"),
    ("cluster.num_nodes=0", "cluster.num_nodes=0 must be a number >= 1"),
    ("cluster.env_threads=nodes", "cluster.env_threads='nodes' is not valid (did you mean 'node'?)"),
    # fp16 trains the LoRA without loss scaling; the rollout shares the key, so the line says what to set instead
    ("actor.model.precision=fp16", ("actor.model.precision='fp16' must be bf16, or fp32 (fp16 trains the LoRA "
                                    "without loss scaling: its gradients underflow silently")),
    ("actor.model.tiny.lora_alpha=0", "actor.model.tiny.lora_alpha=0 must be a number > 0"),
    ("env.eval.reward.timeout_s=0", "env.eval.reward.timeout_s=0.0 must be a number > 0"),
    ("env.train.reward.batch_size=0", "env.train.reward.batch_size=0 must be a number >= 1"),
    # an image recipe never chunks frames, so only this key check stops a frame_interval of 0 (train and held-out)
    ("env.eval.reward.frame_interval=0", "env.eval.reward.frame_interval=0 must be a number >= 1 (frames per chunk"),
    ("env.train.reward.frame_interval=0", "env.train.reward.frame_interval=0 must be a number >= 1"),
    ("runner.seed=-1", "runner.seed=-1 must be a number >= 0 and <= 4.29497e+09"),
    ("algorithm.nft_clip_ratio=0", "algorithm.nft_clip_ratio=0.0 must be a number > 0 or null"),
    # paths that must exist
    ("runner.resume_dir=nowhere/step_3", "runner.resume_dir='nowhere/step_3' does not exist"),
    ("actor.model.tiny.lora_path=missing_lora", "actor.model.tiny.lora_path='missing_lora' does not exist"),
    ("env.train.reward.token_file=missing.token", "env.train.reward.token_file='missing.token' does not exist"),
    # cross-section: a video recipe's frames, advantages and rewards
    ("actor.model.tiny.num_frames=5", "algorithm.adv_type='grpo' does not fit actor.model.tiny.num_frames=5"),
    ("algorithm.adv_type=grpo_video", "algorithm.advantage_mode='global' is not valid for algorithm.adv_type="),
])
def test_bad_values_are_rejected_with_key_value_and_what_is_allowed(recipe_dir, override, message):
    with pytest.raises(RecipeError) as err:
        load(recipe_dir, override)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_resume_dir_auto_and_existing_paths_pass(recipe_dir, tmp_path: Path):
    (tmp_path / "lora").mkdir()
    cfg = load(recipe_dir, "runner.resume_dir=auto", f"actor.model.tiny.lora_path={tmp_path / 'lora'}")
    assert cfg.runner.resume_dir == "auto"


def test_video_recipe_needs_matching_reward_and_chunks(recipe_dir):
    video = ["actor.model.tiny.num_frames=5", "algorithm.adv_type=grpo_video", "algorithm.advantage_mode=video"]
    with pytest.raises(RecipeError, match=r"env.train.reward.model='ocr' scores images only, but "
                                          r"actor.model.tiny.num_frames=5; use video_ocr"):
        load(recipe_dir, *video)
    video += ["env.train.reward.model=video_ocr", "env.eval.reward.model=video_ocr"]
    with pytest.raises(RecipeError, match=r"env.train.reward.frame_interval=2 gives 3 chunk rewards for "
                                          r"actor.model.tiny.num_frames=5, which has 2 latent frames"):
        load(recipe_dir, *video, "env.train.reward.frame_interval=2")
    assert load(recipe_dir, *video).algorithm.adv_type == "grpo_video"
    with pytest.raises(RecipeError, match=r"env.eval.reward.model='video_ocr' scores videos only"):
        load(recipe_dir, "env.eval.reward.model=video_ocr")


def test_multi_reward_parts_are_checked_like_rewards(recipe_dir):
    def multi(parts):
        def edit(recipe):
            recipe["env"]["train"]["reward"] = {"type": "multi", "rewards": parts}
        return edit

    write_recipe(recipe_dir, "bad_part", multi([{"model": "ocr"}, {"model": "image_stats", "batch_size": 0}]))
    with pytest.raises(RecipeError, match=r"env.train.reward.rewards\[1\].batch_size=0 must be a number >= 1"):
        load(recipe_dir, name="bad_part")
    write_recipe(recipe_dir, "bad_name", multi([{"model": "jpeg_compressibilty"}]))
    with pytest.raises(RecipeError, match=r"rewards\[0\].model='jpeg_compressibilty' is not valid \(did you mean "
                                          r"'jpeg_compressibility'\?\)"):
        load(recipe_dir, name="bad_name")
    write_recipe(recipe_dir, "bad_key", multi([{"model": "ocr", "engin": "rapidocr"}]))
    with pytest.raises(RecipeError, match=r"rewards\[0\].engin is not a reward key \(did you mean 'engine'\?\)"):
        load(recipe_dir, name="bad_key")


def test_a_logger_backend_that_is_not_installed_stops_the_recipe_with_its_install_line(recipe_dir, monkeypatch):
    from rlrunner.tracking import backends as logger_backends

    monkeypatch.setitem(logger_backends.PACKAGES, "swanlab", ("swanlab_not_installed_here", "swanlab"))
    with pytest.raises(RecipeError) as err:
        load(recipe_dir, "runner.logger.logger_backends=[tensorboard,swanlab]")
    assert str(err.value) == ("runner.logger.logger_backends has 'swanlab' but swanlab is not installed; pip install "
                              "swanlab (or pip install -r requirements/loggers.txt), or drop 'swanlab' from the list")


def test_prompt_files_are_read_when_the_recipe_is_checked(recipe_dir, tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a sign that says \\"ab\\""}\n{"prompt": "b"\n')
    with pytest.raises(RecipeError) as err:
        load(recipe_dir, f"env.eval.dataset.path={bad}")
    assert str(err.value).startswith(f"env.eval.dataset.path={str(bad)!r}: {bad}:2: not valid JSON")
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "a sign that says \\"ab\\"", "tag": "ocr"}\n')
    with pytest.raises(RecipeError, match=r"good.jsonl:1: no 'prompt' key \(keys: \['tag', 'text'\]\)"):
        load(recipe_dir, f"env.train.dataset.path={good}")
    assert load(recipe_dir, f"env.train.dataset.path={good}", "env.train.dataset.prompt_key=text")

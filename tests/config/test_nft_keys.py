"""The NFT variant keys: each names its valid values, and rollout states cannot be drawn more often than a
trajectory has them."""

import pytest

from rlrunner.config.errors import RecipeError
from tests.config.test_loader import load


@pytest.mark.parametrize(("overrides", "message"), [
    (["algorithm.nft_xcur_source=trajectory"],
     "algorithm.nft_xcur_source='trajectory' is not valid; choose one of ['resample', 'rollout']"),
    (["algorithm.nft_train_timesteps=shifted"],
     "algorithm.nft_train_timesteps='shifted' is not valid; choose one of ['uniform', 'sampler']"),
    (["algorithm.nft_adv_mode=positive"],
     ("algorithm.nft_adv_mode='positive' is not valid (did you mean 'positive_only'?); choose one of ['all', "
      "'positive_only', 'negative_only', 'one_only', 'binary']")),
    (["algorithm.nft_xcur_source=rollout", "algorithm.nft_timesteps_per_sample=11"],
     "algorithm.nft_timesteps_per_sample=11 exceeds the 10 rollout states of a sample (actor.model.tiny.num_steps)"),
])
def test_bad_nft_variant_values_are_rejected_by_name(recipe_dir, overrides, message):
    with pytest.raises(RecipeError) as err:
        load(recipe_dir, *overrides)
    assert message in str(err.value)


def test_rollout_states_up_to_num_steps_and_sampler_timesteps_load(recipe_dir):
    cfg = load(recipe_dir, "algorithm.nft_xcur_source=rollout", "algorithm.nft_timesteps_per_sample=10",
               "algorithm.nft_train_timesteps=sampler")
    assert cfg.algorithm.nft_xcur_source == "rollout" and cfg.algorithm.nft_train_timesteps == "sampler"


def test_every_adv_mode_loads_and_all_is_the_default(recipe_dir):
    assert load(recipe_dir).algorithm.nft_adv_mode == "all"
    for mode in ("positive_only", "negative_only", "one_only", "binary"):
        assert load(recipe_dir, f"algorithm.nft_adv_mode={mode}").algorithm.nft_adv_mode == mode

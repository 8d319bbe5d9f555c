"""runner.watch's keys: bad guard settings (each a reward setting with a name, checked as a reward's keys are) and
bad alarm settings are refused before launch in one line."""

import pytest

from rlrunner.config.errors import RecipeError
from tests.config.test_loader import load, write_recipe


def with_guards(*guards):
    def edit(recipe):
        recipe["runner"]["watch"]["guards"] = list(guards)
    return edit


@pytest.mark.parametrize(("guards", "message"), [
    ([{"model": "image_stats"}], r"runner.watch.guards\[0\].name=None must be a name of letters"),
    ([{"name": "a b", "model": "image_stats"}], r"runner.watch.guards\[0\].name='a b' must be a name"),
    ([{"name": "diversity", "model": "image_stats"}], r"runner.watch.guards\[0\].name='diversity' is taken"),
    ([{"name": "t", "model": "image_stats"}, {"name": "t", "model": "ocr"}], r"guards\[1\].name='t' is taken"),
    ([{"name": "t", "model": "image_stat"}], (r"runner.watch.guards\[0\].model='image_stat' is not valid \(did "
                                              r"you mean 'image_stats'\?\)")),
    ([{"name": "t", "model": "ocr", "batch_size": 0}], r"runner.watch.guards\[0\].batch_size=0 must be a number >= 1"),
    ([{"name": "t", "model": "ocr", "engin": "rapidocr"}], (r"guards\[0\].engin is not a reward key \(did you "
                                                           r"mean 'engine'\?\)")),
    ([{"name": "t", "model": "vlm_ocr"}], r"runner.watch.guards\[0\].base_url is empty; reward.model=vlm_ocr needs"),
    (["image_stats"], r"runner.watch.guards\[0\]='image_stats' must be a mapping of reward keys with a name"),
])
def test_bad_guard_settings_are_refused_before_launch_in_one_line(recipe_dir, guards, message):
    write_recipe(recipe_dir, "bad_guard", with_guards(*guards))
    with pytest.raises(RecipeError, match=message) as err:
        load(recipe_dir, name="bad_guard")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("override", "message"), [
    ("runner.watch.action=halt", "runner.watch.action='halt' is not valid; choose one of ['warn', 'stop']"),
    ("runner.watch.max_drop=0", "runner.watch.max_drop=0.0 must be a number > 0 and <= 1"),
    ("runner.watch.window=0", "runner.watch.window=0 must be a number >= 1"),
])
def test_bad_alarm_settings_are_refused_in_one_line(recipe_dir, override, message):
    with pytest.raises(RecipeError) as err:
        load(recipe_dir, override)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_good_guards_pass(recipe_dir):
    write_recipe(recipe_dir, "good", with_guards({"name": "texture", "model": "image_stats"}))
    assert load(recipe_dir, name="good").runner.watch.guards[0].name == "texture"

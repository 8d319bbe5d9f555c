"""Family choices checked before anything starts: ``model_type: auto`` picks the family from the folder's
``model_index.json``, and a folder, guidance kind or resolution the family cannot take is one line (RecipeError,
raised by the launcher's recipe check, before Ray or any worker)."""

from __future__ import annotations

import json
import shutil

import pytest

from rlrunner.config.errors import RecipeError

FAMILIES = ["sd3", "wan22_ti2v_5b", "wan21_t2v", "wan22_t2v_a14b", "qwen_image", "zimage", "flux2_klein", "flux1"]


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("model_type", FAMILIES)
def test_model_type_auto_picks_the_family_of_the_folder(family_recipe, model_type):
    cfg = family_recipe(model_type, "actor.model.model_type=auto")
    assert cfg.actor.model.model_type == model_type


def test_model_type_auto_names_a_pipeline_class_no_family_knows(family_recipe, tiny_dirs, tmp_path):
    folder = shutil.copytree(tiny_dirs("sd3"), tmp_path / "other")
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": "HunyuanVideoPipeline"}))
    with pytest.raises(RecipeError) as err:
        family_recipe("sd3", "actor.model.model_type=auto", path=folder)
    message = _one_line(err)
    assert "holds a HunyuanVideoPipeline pipeline and no family here knows it" in message
    assert "StableDiffusion3Pipeline" in message and "qwen_image" in message


def test_model_type_auto_needs_a_local_folder(family_recipe):
    with pytest.raises(RecipeError) as err:
        family_recipe("sd3", "actor.model.model_type=auto", path="someorg/somemodel")
    assert "model_type=auto reads model_index.json of a local folder" in _one_line(err)


@pytest.mark.parametrize(("model_type", "overrides", "expected"), [
    # a folder of another family
    ("qwen_image", ("actor.model.model_type=sd3",),
     "holds a QwenImagePipeline pipeline, but model_type 'sd3' expects a StableDiffusion3Pipeline"),
    # a guidance kind the family's pipeline does not have
    ("sd3", ("actor.model.sd3.guidance=embedded",),
     "actor.model.sd3.guidance='embedded' is not supported by this family; choose one of ['auto', 'cfg']"),
    ("sd3", ("actor.model.sd3.guidance=bogus",), "actor.model.sd3.guidance='bogus' is not valid"),
    # latents that do not patch evenly: the tiny SD3's VAE (2x) x patch 1, the tiny Qwen-Image's VAE (4x) x 2x2
    # packing (the published folders: 8x x 2 = 16, read from the same configs)
    ("sd3", ("actor.model.sd3.resolution=15",), "sd3 resolution 15x15 must be divisible by 2"),
    ("qwen_image", ("actor.model.qwen_image.resolution=[32,44]",),
     "qwen_image resolution 32x44 must be divisible by 8 (VAE factor x patch size); nearest valid: 32x48"),
])
def test_a_folder_guidance_or_resolution_the_family_cannot_take_is_one_line(family_recipe, model_type, overrides,
                                                                             expected):
    with pytest.raises(RecipeError) as err:
        family_recipe(model_type, *overrides)
    assert expected in _one_line(err)


@pytest.mark.parametrize("family, limit, source", [("sd3", 512, "T5's"), ("qwen_image", 1024, "QwenImagePipeline's")])
def test_a_family_refuses_more_prompt_tokens_than_its_text_encoder_reads(family, limit, source):
    from omegaconf import OmegaConf

    from rlrunner.models import model_class

    model = model_class(family).__new__(model_class(family))  # the check reads the settings alone
    model.cfg = OmegaConf.create({"max_sequence_length": limit})
    model.check_pipeline(pipe=None)
    model.cfg = OmegaConf.create({"max_sequence_length": limit + 1})
    with pytest.raises(ValueError, match=f"^actor.model.{family}.max_sequence_length={limit + 1} exceeds {source} "
                                         f"{limit} tokens; use at most {limit}$"):
        model.check_pipeline(pipe=None)

"""Guidance is resolved once, into one Guidance value: each family's rule from the recipe and the folder's config
dicts (hand-written expectations), and a built model that samples, trains and evaluates without resolving again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from family_helpers import make_noise
from omegaconf import OmegaConf

from rlrunner.cluster import detect_devices_per_node, parse_placement
from rlrunner.config.loader import RecipeError
from rlrunner.config.schema import AlgorithmConfig
from rlrunner.models import model_class
from rlrunner.models.guidance import PLAIN_COMBINE, Guidance
from rlrunner.models.settings import FamilyConfig
from rlrunner.objectives import build_objective
from rlrunner.recipe import load_recipe
from rlrunner.sizing.memory import model_sizes, step_geometry

ZIMAGE_COMBINE = "pos + (s - 1) (pos - neg)"
DEV = {"transformer": {"guidance_embeds": True}}  # FLUX.1-dev's transformer config, as far as guidance reads it
SCHNELL = {"transformer": {"guidance_embeds": False}}


def _cfg(**settings):
    return OmegaConf.structured(FamilyConfig(**settings))


@pytest.mark.parametrize(("family", "settings", "configs", "expected"), [
    # cfg, the default of most families: two passes above scale 1, one at 1
    ("sd3", {"guidance_scale": 4.5, "eval_guidance_scale": 3.0}, {}, Guidance("cfg", 4.5, 3.0)),
    ("sd3", {}, {}, Guidance("cfg", 1.0, 1.0)),
    ("qwen_image", {"guidance_scale": 4.0, "eval_guidance_scale": 4.0}, {"transformer": {"guidance_embeds": False}},
     Guidance("cfg", 4.0, 4.0)),
    # Z-Image: cfg combined as pos + (s - 1)(pos - neg), the pipeline's guidance_scale g = s - 1; Turbo: none
    ("zimage", {"guidance_scale": 5.0, "eval_guidance_scale": 5.0}, {}, Guidance("cfg", 5.0, 5.0,
                                                                                  combine=ZIMAGE_COMBINE)),
    ("zimage", {"guidance": "none"}, {}, Guidance("none", 1.0, 1.0, combine=ZIMAGE_COMBINE)),
    # FLUX.1: auto is embedded on a dev folder, none on schnell; cfg (true_cfg_scale) on schnell when asked
    ("flux1", {"guidance_scale": 3.5, "eval_guidance_scale": 3.5}, DEV, Guidance("embedded", 3.5, 3.5)),
    ("flux1", {}, SCHNELL, Guidance("none", 1.0, 1.0)),
    ("flux1", {"guidance": "cfg", "guidance_scale": 4.0, "eval_guidance_scale": 4.0}, SCHNELL,
     Guidance("cfg", 4.0, 4.0)),
    ("flux1", {"guidance_scale": 3.5, "eval_guidance_scale": 3.5}, {}, Guidance("embedded", 3.5, 3.5)),  # a hub id
    # FLUX.2-klein: base guides with cfg, the step-distilled klein (is_distilled) samples without guidance
    ("flux2_klein", {"guidance_scale": 4.0, "eval_guidance_scale": 4.0}, {"model_index": {"is_distilled": False}},
     Guidance("cfg", 4.0, 4.0)),
    ("flux2_klein", {}, {"model_index": {"is_distilled": True}}, Guidance("none", 1.0, 1.0)),
    # Wan2.2 A14B: the low-noise expert's scale in force: guidance_scale_2, or guidance_scale when that is null
    ("wan22_t2v_a14b", {"guidance_scale": 4.0, "guidance_scale_2": 3.0, "eval_guidance_scale": 5.0}, {},
     Guidance("cfg", 4.0, 5.0, 3.0, 5.0)),
    ("wan22_t2v_a14b", {"guidance_scale_2": 1.0}, {}, Guidance("cfg", 1.0, 1.0, 1.0, 1.0)),
    ("wan22_ti2v_5b", {"guidance_scale": 5.0, "eval_guidance_scale": 5.0}, {}, Guidance("cfg", 5.0, 5.0)),
])
def test_each_family_rule_resolves_to_its_documented_value(family, settings, configs, expected):
    assert model_class(family).resolve_guidance(_cfg(**settings), configs) == expected


@pytest.mark.parametrize(("guidance", "passes", "eval_passes"), [
    (Guidance("cfg", 4.0, 1.0), 2, 1), (Guidance("embedded", 3.5, 3.5), 1, 1), (Guidance("none", 1.0, 1.0), 1, 1),
    (Guidance("cfg", 1.0, 7.0), 1, 2),
])
def test_passes_count_the_denoiser_calls_of_a_step(guidance, passes, eval_passes):
    """cfg above 1 runs the negative and conditional halves; embedded guidance is an input of one pass."""
    assert (guidance.passes, guidance.eval_passes) == (passes, eval_passes)
    assert Guidance("cfg", 2.0, 2.0).combine == PLAIN_COMBINE


@pytest.mark.parametrize(("family", "settings", "configs", "message"), [
    ("sd3", {"guidance": "embedded"}, {},
     r"^actor.model.sd3.guidance='embedded' is not supported by this family; choose one of \['auto', 'cfg'\]$"),
    ("zimage", {"guidance": "none", "guidance_scale": 2.0}, {},
     r"^actor.model.zimage.guidance=none samples without guidance, but guidance_scale=2.0 / eval_guidance_scale=1.0"),
    ("flux1", {"guidance": "embedded"}, SCHNELL, r"this FLUX.1 transformer has no guidance embedding"),
    ("flux1", {"guidance_scale": 3.5}, SCHNELL, r"samples without guidance \(guidance_embeds: false, guidance none\)"),
    ("flux2_klein", {"guidance": "cfg"}, {"model_index": {"is_distilled": True}},
     r"guidance=cfg on a step-distilled klein"),
    ("flux2_klein", {}, {"transformer": {"guidance_embeds": True}}, r"passes no guidance to the transformer"),
    ("qwen_image", {}, {"transformer": {"guidance_embeds": True}}, r"guidance-distilled Qwen-Image transformers"),
    ("sd3", {"guidance_scale_2": 3.0}, {},
     r"^actor.model.sd3.guidance_scale_2=3.0 applies to a model with two experts \(wan22_t2v_a14b\)"),
    ("wan22_t2v_a14b", {"eval_guidance_scale_2": 3.0}, {},
     r"^actor.model.wan22_t2v_a14b.eval_guidance_scale_2=3.0 but eval_guidance_scale=1.0: the pipeline guides"),
])
def test_a_bad_guidance_setting_is_one_line_naming_the_key(family, settings, configs, message):
    with pytest.raises(ValueError, match=message) as err:
        model_class(family).resolve_guidance(_cfg(**settings), configs)
    assert "\n" not in str(err.value)


def test_a_model_resolves_its_guidance_once_and_samples_trains_and_evaluates_with_it(load_tiny, monkeypatch):
    """The family's rule (guidance_kind) runs once, while the model is built; sampling, the loss's velocity and a
    training rollout read model.resolved_guidance (here: embedded at 3.5 on the tiny FLUX.1-dev folder)."""
    family = model_class("flux1")
    calls = []
    rule = family.guidance_kind.__func__

    def counted(cls, family_cfg, configs):
        calls.append(sorted(configs))
        return rule(cls, family_cfg, configs)

    monkeypatch.setattr(family, "guidance_kind", classmethod(counted))
    model = load_tiny("flux1", guidance_scale=3.5, eval_guidance_scale=2.0)
    assert len(calls) == 1 and {"model_index", "transformer", "vae"} <= set(calls[0])  # the folder's configs
    assert model.resolved_guidance == Guidance("embedded", 3.5, 2.0) and model.guidance == "embedded"
    cond = model.encode_prompts(["a cat", "a dog"])
    noise = make_noise(model, 2, torch.Generator().manual_seed(0))
    model.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=2.0)
    objective = build_objective(OmegaConf.structured(AlgorithmConfig()), model.cfg, model.resolved_guidance)
    x0, _ = objective.rollout(model, cond, noise, torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.velocity(noise, torch.full((2,), 0.5), cond)
    assert len(calls) == 1
    # the training rollout sampled at the resolved scale: the same as sampling at 3.5 by hand
    by_hand = model.sample(cond, noise, sampler=model.cfg.train_sampler, num_steps=model.cfg.num_steps,
                           guidance_scale=3.5, adapter=objective.sampling_adapter)
    torch.testing.assert_close(x0, by_hand)


# ------------------------------------------------------------------ the recipe check and the memory plan read it
ROOT = Path(__file__).resolve().parents[2]
TINY_DATA = [f"env.{split}.dataset.path=examples/diffusion/data/tiny_ocr" for split in ("train", "eval")]
FLOW_GRPO = ["algorithm.name=flow_grpo", "algorithm.adv_type=grpo", "actor.model.flux1.train_sampler=euler"]


def test_flow_grpo_check_reads_the_guidance_resolved_on_the_folder(tiny_dirs, tiny_flux1_schnell_dir, monkeypatch):
    """flow_grpo refuses two-pass guidance: embedded 3.5 on a dev folder is one pass and passes; cfg 4 on a schnell
    folder is refused with one line."""
    monkeypatch.chdir(ROOT)
    load_recipe("flux1_dev_nft_ocr", [*TINY_DATA, *FLOW_GRPO, f"actor.model.model_path={tiny_dirs('flux1')}"])
    with pytest.raises(RecipeError, match=r"guidance_scale=4.0 but algorithm.name=flow_grpo trains without") as err:
        load_recipe("flux1_dev_nft_ocr", [*TINY_DATA, *FLOW_GRPO, f"actor.model.model_path={tiny_flux1_schnell_dir}",
                                          "actor.model.flux1.guidance=cfg", "actor.model.flux1.guidance_scale=4.0",
                                          "actor.model.flux1.eval_guidance_scale=4.0"])
    assert "\n" not in str(err.value)


def test_the_memory_plan_counts_the_passes_of_the_resolved_guidance(load_tiny, tiny_dirs, monkeypatch):
    """The plan's sizes carry the guidance a loaded model resolves from the same folder, and a rollout step's
    denoiser passes (cfg_factor) are that value's."""
    monkeypatch.chdir(ROOT)
    cfg = load_recipe("flux1_dev_nft_ocr", [*TINY_DATA, f"actor.model.model_path={tiny_dirs('flux1')}",
                                            "actor.model.flux1.resolution=16", "actor.model.flux1.max_sequence_length=8"])
    sizes = model_sizes(cfg.actor.model, tiny_dirs("flux1"))
    model = load_tiny("flux1", guidance_scale=3.5, eval_guidance_scale=3.5)
    assert sizes.guidance == model.resolved_guidance == Guidance("embedded", 3.5, 3.5)
    placement = parse_placement(cfg.cluster.component_placement, cfg.cluster.num_nodes,
                                detect_devices_per_node(cfg.cluster))
    assert step_geometry(cfg, placement, sizes.guidance).cfg_factor == 1
    assert step_geometry(cfg, placement, Guidance("cfg", 3.5, 3.5)).cfg_factor == 2

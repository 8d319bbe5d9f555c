"""The context-parallel checks that hold at real size: the attention backend diffusers' registry runs each CP mode
on (before launch from ``DIFFUSERS_ATTN_BACKEND``, and in each worker from its own diffusers), and every sequence
a family's ``_cp_plan`` splits, FLUX.1's and FLUX.2's text included."""

from __future__ import annotations

import pytest
from cp_helpers import rollout_refusal, spawn
from omegaconf import OmegaConf
from runner_helpers import small_recipe

from rlrunner.config.errors import RecipeError
from rlrunner.distributed.context_parallel import cp_backends

TWO = ["cluster.num_devices_per_node=2", "cluster.component_placement={'actor,env,rollout': all}"]
# settings at which each tiny family's latent and heads split over 2 ranks (the text is the tests' business)
SETTINGS = {"wan22_ti2v_5b": ["resolution=64", "num_frames=5", "max_sequence_length=8"],
            "qwen_image": ["resolution=32", "max_sequence_length=64"],
            "flux1": ["resolution=16", "max_sequence_length=8", "guidance_scale=3.5", "eval_guidance_scale=3.5"],
            "flux2_klein": ["resolution=32", "max_sequence_length=64"]}
VIDEO = ["algorithm.adv_type=grpo_video", "algorithm.advantage_mode=video"]


def _recipe(root, tiny_dirs, family: str, *overrides: str):
    settings = [f"actor.model.{family}.{s}" for s in SETTINGS[family]]
    return small_recipe(root, f"actor.model.model_type={family}", f"actor.model.model_path={tiny_dirs(family)}",
                        "actor.model.precision=fp32", "actor.model.device=cpu", *TWO, *settings,
                        *(VIDEO if family.startswith("wan") else []), *overrides)


def _error(root, tiny_dirs, family: str, *overrides: str) -> str:
    with pytest.raises(RecipeError) as err:  # loading a recipe validates it
        _recipe(root, tiny_dirs, family, *overrides)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_backend_diffusers_runs_no_cp_on_is_refused_before_launch(tmp_path, tiny_dirs, monkeypatch):
    ulysses, ring = cp_backends("ulysses"), cp_backends("ring")
    assert {"native", "flash"} <= set(ulysses) and "_native_math" not in ulysses
    assert "flash" in ring and not {"native", "_flash_3", "flash_varlen"} & set(ring)
    monkeypatch.setenv("DIFFUSERS_ATTN_BACKEND", "_native_math")  # SDPA's math kernel: no CP in diffusers
    error = _error(tmp_path, tiny_dirs, "wan22_ti2v_5b", "actor.context_parallel_size=2")
    assert error == "actor.context_parallel_size=2 with actor.context_parallel_mode=ulysses needs an attention " \
                    "backend that diffusers marks context-parallel, and '_native_math' is not one; those that are: " \
                    f"{', '.join(ulysses)}; set DIFFUSERS_ATTN_BACKEND (now '_native_math') to one of them"
    assert _error(tmp_path, tiny_dirs, "wan22_ti2v_5b", "rollout.context_parallel_size=2").startswith(
        "rollout.context_parallel_size=2 with the rollout's mode ulysses needs an attention backend that diffusers "
        "marks context-parallel, and '_native_math' is not one")
    # FA3 as many H100/H200 runs set it: diffusers marks only its hub kernels context-parallel
    monkeypatch.setenv("DIFFUSERS_ATTN_BACKEND", "_flash_3")
    assert f"and '_flash_3' is not one; those that are: {', '.join(ring)};" in _error(
        tmp_path, tiny_dirs, "wan22_ti2v_5b", "actor.context_parallel_size=2", "actor.context_parallel_mode=ring")
    monkeypatch.setenv("DIFFUSERS_ATTN_BACKEND", "flash")  # one that runs both modes passes
    for mode in ("ulysses", "ring"):
        _recipe(tmp_path, tiny_dirs, "wan22_ti2v_5b", "actor.context_parallel_size=2",
                f"actor.context_parallel_mode={mode}")


@pytest.mark.slow
def test_a_worker_whose_diffusers_runs_no_cp_refuses_at_cp_set_up(tmp_path, tiny_dirs, monkeypatch):
    monkeypatch.delenv("DIFFUSERS_ATTN_BACKEND", raising=False)
    cfg = _recipe(tmp_path, tiny_dirs, "wan22_ti2v_5b", "rollout.context_parallel_size=2")  # the driver's is fine
    OmegaConf.save(cfg, tmp_path / "recipe.yaml")
    # the workers' processes import diffusers with their own environment (as on nodes set up apart from the driver)
    monkeypatch.setenv("DIFFUSERS_ATTN_BACKEND", "_native_math")
    spawn(rollout_refusal, 2, str(tmp_path / "recipe.yaml"), str(tmp_path))
    for rank in range(2):
        assert (tmp_path / f"refusal_rank{rank}.txt").read_text() == \
            "WanTransformer3DModel: context_parallel_mode=ulysses needs an attention backend that diffusers marks " \
            f"context-parallel, and '_native_math' is not one; those that are: {', '.join(cp_backends('ulysses'))}; " \
            "set DIFFUSERS_ATTN_BACKEND on the workers"


@pytest.mark.parametrize(("family", "denoiser"), [("flux1", "FluxTransformer2DModel"),
                                                  ("flux2_klein", "Flux2Transformer2DModel")])
def test_text_tokens_the_cp_plan_splits_must_divide(tmp_path, tiny_dirs, family, denoiser):
    key = f"actor.model.{family}.max_sequence_length"
    assert _error(tmp_path, tiny_dirs, family, "actor.context_parallel_size=2", f"{key}=9") == \
        f"actor.context_parallel_size=2 with actor.model.{family}: the {denoiser} _cp_plan splits the text too, and " \
        f"its 9 tokens ({key}=9) are not divisible by context parallel size 2; set {key} to 8 or 10"
    _recipe(tmp_path, tiny_dirs, family, "actor.context_parallel_size=2", f"{key}=10")


def test_text_the_cp_plan_does_not_split_or_the_family_pads_may_be_any_length(tmp_path, tiny_dirs):
    _recipe(tmp_path, tiny_dirs, "wan22_ti2v_5b", "actor.context_parallel_size=2",
            "actor.model.wan22_ti2v_5b.max_sequence_length=9")  # Wan's plan splits the latent only
    _recipe(tmp_path, tiny_dirs, "qwen_image", "actor.context_parallel_size=2",
            "actor.model.qwen_image.max_sequence_length=63")  # Qwen-Image pads its text to whole slices

"""Wan2.2 A14B's two experts (rlrunner/models/wan_a14b.py) and the Wan folder layouts, on tiny random-weight folders.

The rollout switches expert on the pipeline's step (WanPipeline.__call__ with transformer_2 and boundary_ratio);
a training micro-batch that straddles the boundary equals each row computed alone by its expert; an expert without
rows gets a zero gradient (never none, which DDP cannot reduce); export writes the two files diffusers loads.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from family_helpers import PIPELINE_CALLS, make_noise, pipeline_sample, reference_scheduler

from rlrunner.algorithms.nft_loss import nft_loss
from rlrunner.models import EMA_ADAPTER, TRAINED_ADAPTER, detect_model_type
from rlrunner.models.wan_a14b import LORA_FILES

A14B = "wan22_t2v_a14b"
PROMPTS = ['a sign that says "open"', "a cat", 'the word "rl"', "a dog"]
ROOT = Path(__file__).resolve().parents[2]


def _perturb(model, adapter: str, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.adapter_parameters(adapter):
            p.add_(0.3 * torch.randn(p.shape, generator=gen))


def _record_experts(model) -> list[tuple[float, str]]:
    """(timestep, expert) of every expert call on real rows, in order."""
    calls: list[tuple[float, str]] = []
    for name in ("transformer", "transformer_2"):
        getattr(model.pipe, name).register_forward_pre_hook(
            lambda _m, _a, kw, name=name: calls.append((round(float(kw["timestep"].flatten()[0]), 3), name)),
            with_kwargs=True)
    return calls


@pytest.mark.parametrize("resolution", [32, [32, 48]])
@pytest.mark.parametrize(("guidance_scale", "guidance_scale_2"), [(1.0, None), (4.0, None), (4.0, 2.5)])
def test_rollout_switches_expert_on_the_pipelines_step(load_tiny, resolution, guidance_scale, guidance_scale_2):
    model = load_tiny(A14B, resolution=resolution)
    _perturb(model, EMA_ADAPTER)
    cond = model.encode_prompts(PROMPTS[:2])
    noise = make_noise(model, 2, torch.Generator().manual_seed(5))
    calls = _record_experts(model)
    ours = model.sample(cond, noise, sampler="euler", num_steps=4, guidance_scale=guidance_scale,
                        guidance_scale_2=guidance_scale_2)
    our_calls = sorted(set(calls))
    calls.clear()
    call_kwargs, _ = PIPELINE_CALLS[A14B]
    negative = model.negative_cond(2) if guidance_scale > 1 else None
    original, model.pipe.scheduler = model.pipe.scheduler, reference_scheduler(model)
    with model.use_adapter(EMA_ADAPTER):
        theirs = model.pipe(**call_kwargs(model, cond, noise, guidance_scale, negative), num_inference_steps=4,
                            guidance_scale_2=guidance_scale_2, output_type="latent", return_dict=False)[0]
    model.pipe.scheduler = original
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=1e-5)
    # shift 3.0 at 4 steps: sigmas 1, 0.9, 0.75, 0.5 -> two high-noise steps, then two low-noise steps
    assert our_calls == sorted(set(calls))
    assert [name for _, name in sorted(our_calls, reverse=True)] == ["transformer"] * 2 + ["transformer_2"] * 2
    if guidance_scale_2 is not None:  # the low-noise scale matters: it is not the high-noise one in disguise
        same = model.sample(cond, noise, sampler="euler", num_steps=4, guidance_scale=guidance_scale)
        assert not torch.allclose(ours, same, atol=1e-4)


@pytest.mark.parametrize("guidance_scale", [1.0, 4.0])
def test_wan21_rollout_equals_the_pipeline_at_a_second_resolution(load_tiny, guidance_scale):
    """test_model_families checks 32x32; Wan2.1's 8x VAE at 32x48 (a 4x6 latent, 2x3 patches) too."""
    model = load_tiny("wan21_t2v", resolution=[32, 48])
    _perturb(model, EMA_ADAPTER)
    cond = model.encode_prompts(PROMPTS[:2])
    noise = make_noise(model, 2, torch.Generator().manual_seed(4))
    assert model.latent_shape == (16, 2, 4, 6) and not model.expand_timesteps
    ours = model.sample(cond, noise, sampler="euler", num_steps=3, guidance_scale=guidance_scale)
    theirs = pipeline_sample(model, cond, noise, num_steps=3, guidance_scale=guidance_scale)
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=1e-5)


def test_straddling_micro_batch_equals_each_row_alone_with_its_expert(load_tiny):
    model = load_tiny(A14B)
    _perturb(model, TRAINED_ADAPTER)
    experts = model.transformer.experts
    cond = model.encode_prompts(PROMPTS)
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn((4, *model.latent_shape), generator=gen)
    x_t = torch.randn((4, *model.latent_shape), generator=gen)
    t = torch.tensor([0.2, 0.95, 0.5, 0.9])  # low, high, low, high: rows interleave across the boundary
    advantages = torch.tensor([1.0, -0.5, 0.3, 2.0])
    assert model.is_high_noise(t, x_t).tolist() == [False, True, False, True]
    with torch.no_grad():
        v_old = model.velocity(x_t, t, cond, adapter=EMA_ADAPTER)
    params = model.trainable_parameters()

    def loss_and_grads(v_theta):
        loss, _ = nft_loss(v_theta, v_old, x_t, x0, t, advantages, beta=0.1, adv_clip_max=5.0)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return loss.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]

    batched, batched_grads = loss_and_grads(model.velocity(x_t, t, cond))
    rows = []
    for i in range(4):
        expert = experts["transformer" if t[i] >= 0.875 else "transformer_2"]
        rows.append(expert(hidden_states=x_t[i:i + 1], timestep=t[i:i + 1] * 1000,
                           encoder_hidden_states=cond["prompt_embeds"][i:i + 1], return_dict=False)[0])
    alone, alone_grads = loss_and_grads(torch.cat(rows))
    torch.testing.assert_close(batched, alone, atol=1e-6, rtol=1e-6)
    for name_grad, (ours, theirs) in enumerate(zip(batched_grads, alone_grads)):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6, msg=f"gradient {name_grad}")
    named = dict(model.transformer.named_parameters())
    moved = {n.split(".")[0] for n, p in named.items() if p.requires_grad}
    assert moved == {"transformer", "transformer_2"} and all(g.abs().sum() > 0 for g in batched_grads[:1])


def test_an_expert_without_rows_gets_a_zero_gradient_and_no_call_without_one(load_tiny):
    model = load_tiny(A14B)
    _perturb(model, TRAINED_ADAPTER)
    cond = model.encode_prompts(PROMPTS[:2])
    x_t = torch.randn((2, *model.latent_shape), generator=torch.Generator().manual_seed(2))
    t = torch.tensor([0.95, 0.9])  # both high noise
    model.velocity(x_t, t, cond).square().mean().backward()
    grads = {n.split(".")[0]: [] for n, _ in model.transformer.named_parameters()}
    for n, p in model.transformer.named_parameters():
        if p.requires_grad:
            grads[n.split(".")[0]].append(p.grad)
    assert all(g is not None for g in grads["transformer_2"]), "an idle expert without gradient breaks DDP"
    assert all(torch.count_nonzero(g) == 0 for g in grads["transformer_2"])
    assert any(torch.count_nonzero(g) > 0 for g in grads["transformer"])
    calls = _record_experts(model)
    with torch.no_grad():  # no gradient, not sharded: the idle expert is not called at all
        model.velocity(x_t, t, cond)
    assert [name for _, name in calls] == ["transformer"]


def test_gradient_checkpointing_of_both_experts_gives_the_same_gradients(load_tiny):
    cond_prompts = PROMPTS[:2]
    grads = []
    for checkpointing in (False, True):
        model = load_tiny(A14B, gradient_checkpointing=checkpointing)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():  # the same adapter in both models (LoRA init draws from the global generator)
            for p in model.adapter_parameters(TRAINED_ADAPTER):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        cond = model.encode_prompts(cond_prompts)
        x = torch.randn(2, *model.latent_shape, generator=torch.Generator().manual_seed(0))
        for t in (torch.tensor([0.3, 0.9]), torch.tensor([0.95, 0.9])):  # straddling, then the low expert idle
            model.velocity(x, t, cond).pow(2).mean().backward()
        grads.append([p.grad.clone() for p in model.trainable_parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads, strict=True))


@pytest.mark.parametrize(("train_experts", "files"), [("high", ["transformer"]), ("low", ["transformer_2"])])
def test_train_experts_adapts_only_the_chosen_expert(load_tiny, tmp_path, train_experts, files):
    model = load_tiny(A14B, train_experts=train_experts)
    assert {key.split(".")[0] for key in model.lora_state_dict(TRAINED_ADAPTER)} == set(files)
    assert {n.split(".")[0] for n, p in model.transformer.named_parameters() if p.requires_grad} == set(files)
    model.save_lora(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(LORA_FILES[f] for f in files)
    with pytest.raises(ValueError, match="train_experts='middle'.*both"):
        load_tiny(A14B, train_experts="middle")


def test_exported_files_load_into_both_experts_of_wan_pipeline(load_tiny, tmp_path, caplog):
    model = load_tiny(A14B)
    _perturb(model, TRAINED_ADAPTER)
    cond = model.encode_prompts(PROMPTS[:2])
    x_t = torch.randn((2, *model.latent_shape), generator=torch.Generator().manual_seed(3))
    t = torch.tensor([0.95, 0.3])
    with torch.no_grad():
        expected, base = model.velocity(x_t, t, cond), model.velocity(x_t, t, cond, adapter=None)
    model.save_lora(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(LORA_FILES.values())
    plain = load_tiny(A14B, use_lora=False)
    with caplog.at_level(logging.WARNING):
        plain.pipe.load_lora_weights(str(tmp_path))
        plain.pipe.load_lora_weights(str(tmp_path), weight_name=LORA_FILES["transformer_2"],
                                     load_into_transformer_2=True)
    assert not [r for r in caplog.records if "unexpected" in r.getMessage() or "missing" in r.getMessage()]
    with torch.no_grad():
        loaded = plain.velocity(x_t, t, cond, None)
    torch.testing.assert_close(loaded, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(loaded[1], base[1], atol=1e-4)  # the low-noise row: transformer_2's file applied


def test_export_card_names_both_files(tmp_path):
    from rlrunner.commands.export import model_card

    manifest = {"model_type": A14B, "lora_rank": 4, "lora_alpha": 8, "global_step": 2}
    for name in LORA_FILES.values():
        (tmp_path / name).write_bytes(b"")
    card = model_card("nft", "default", manifest, "/models/a14b", tmp_path, tmp_path)
    assert f"pipe.load_lora_weights({str(tmp_path)!r})" in card
    assert (f"pipe.load_lora_weights({str(tmp_path)!r}, weight_name='{LORA_FILES['transformer_2']}', "
            f"load_into_transformer_2=True)") in card


def test_each_wan_folder_matches_exactly_one_family(tiny_dirs, tmp_path):
    from rlrunner.models import MODEL_FAMILIES, model_class

    for model_type in ("wan22_ti2v_5b", "wan21_t2v", A14B):
        index = json.loads((tiny_dirs(model_type) / "model_index.json").read_text())
        assert detect_model_type(str(tiny_dirs(model_type))) == model_type
        assert [n for n in MODEL_FAMILIES if model_class(n).matches_model_index(index)] == [model_type]
    # a folder saved before diffusers knew the Wan2.2 keys (the published Wan2.1 folders): Wan2.1
    old = {"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]}
    assert [n for n in MODEL_FAMILIES if model_class(n).matches_model_index(old)] == ["wan21_t2v"]


@pytest.mark.parametrize(("model_type", "folder", "message"), [
    (A14B, "wan21_t2v", "Wan2.1 T2V .* but model_type 'wan22_t2v_a14b' expects Wan2.2 A14B .*'wan21_t2v'"),
    ("wan21_t2v", A14B, "Wan2.2 A14B .*but model_type 'wan21_t2v' expects Wan2.1 T2V"),
    ("wan22_ti2v_5b", A14B, "Wan2.2 A14B .*but model_type 'wan22_ti2v_5b'"),
])
def test_a_recipe_on_another_wan_layout_fails_in_one_line_before_launch(tiny_dirs, monkeypatch, model_type, folder,
                                                                        message):
    from rlrunner.config.errors import RecipeError

    monkeypatch.chdir(ROOT)
    overrides = [f"actor.model.model_type={model_type}", f"actor.model.model_path={tiny_dirs(folder)}",
                 f"actor.model.{model_type}.resolution=32", f"actor.model.{model_type}.num_frames=5"]
    with pytest.raises(RecipeError, match=message) as err:
        _load_a14b_recipe(*overrides)
    assert "\n" not in str(err.value).strip()


def _load_a14b_recipe(*overrides: str):
    from rlrunner.recipe import load_recipe

    data = [f"env.{s}.dataset.path=examples/diffusion/data/tiny_ocr" for s in ("train", "eval")]
    return load_recipe("wan22_t2v_a14b_nft_video_ocr", [*data, *overrides])


@pytest.mark.parametrize(("overrides", "message"), [
    (["actor.model.wan22_t2v_a14b.train_experts=middle"], "train_experts.*'middle'.*both"),
    (["actor.model.wan22_t2v_a14b.eval_guidance_scale=1.0"],
     "eval_guidance_scale_2=3.0 but eval_guidance_scale=1.0: the pipeline guides .*only when"),
    (["actor.model.model_type=wan21_t2v", "actor.model.wan21_t2v.train_experts=high"],
     "wan21_t2v.train_experts='high' applies to a model with two experts"),
    (["actor.model.model_type=wan22_ti2v_5b", "actor.model.wan22_ti2v_5b.guidance_scale_2=2.0"],
     "wan22_ti2v_5b.guidance_scale_2=2.0 applies to a model with two experts"),
])
def test_expert_settings_are_checked_in_one_line_before_launch(monkeypatch, overrides, message):
    from rlrunner.config.errors import RecipeError

    monkeypatch.chdir(ROOT)
    with pytest.raises(RecipeError, match=message) as err:
        _load_a14b_recipe(*overrides)
    assert "\n" not in str(err.value).strip()


@pytest.mark.slow
def test_a14b_trains_checkpoints_and_resumes_bitwise(tiny_dirs, tmp_path):
    """Two NFT steps with eval at guidance 4 / 2.5, a checkpoint per step holding both experts' files, and a resume
    from step 1 that ends at step 2 with the uninterrupted run's adapters and optimizer state."""
    from runner_helpers import small_recipe

    from rlrunner.run.runner import run

    family = f"actor.model.{A14B}"
    settings = [f"actor.model.model_type={A14B}", f"actor.model.model_path={tiny_dirs(A14B)}", f"{family}.resolution=32",
                f"{family}.num_frames=1", f"{family}.max_sequence_length=8", f"{family}.num_steps=2",
                f"{family}.eval_num_steps=2", f"{family}.lora_rank=4", f"{family}.lora_alpha=4",
                f"{family}.eval_guidance_scale=4.0", f"{family}.eval_guidance_scale_2=2.5", "actor.model.precision=fp32",
                "runner.max_steps=2", "runner.save_interval=1", "runner.val_check_interval=2",
                "runner.sample_log_interval=0"]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    full.mkdir()
    run(small_recipe(tmp_path, *settings), full)
    checkpoint = full / "checkpoints" / "global_step_1"
    assert sorted(p.name for p in (checkpoint / "adapter").iterdir()) == sorted(LORA_FILES.values())
    resumed.mkdir()
    run(small_recipe(tmp_path, *settings, f"runner.resume_dir={checkpoint}"), resumed)
    states = [torch.load(d / "checkpoints/global_step_2/actor.pt", weights_only=False) for d in (full, resumed)]
    for adapter in ("default", "ema"):
        keys = states[0]["adapters"][adapter]
        assert {k.split(".")[0] for k in keys} == {"transformer", "transformer_2"}
        assert all(torch.equal(v, states[1]["adapters"][adapter][k]) for k, v in keys.items()), adapter
    optimizer = [s["optimizer"]["state"] for s in states]
    assert optimizer[0].keys() == optimizer[1].keys()
    assert all(torch.equal(optimizer[0][i]["exp_avg"], optimizer[1][i]["exp_avg"]) for i in optimizer[0])

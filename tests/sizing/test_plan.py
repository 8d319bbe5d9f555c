"""``python -m rlrunner.commands.plan`` and :mod:`rlrunner.sizing`: sizes from config files equal what the families load.

Lives with the model-family tests for their tiny random-weight folders (``tiny_dirs`` / ``load_tiny``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from family_helpers import make_noise
from omegaconf import OmegaConf

from rlrunner.commands.plan import device_peak, main
from rlrunner.models.meta import CONFIG_FILE, MODEL_INDEX
from rlrunner.models.tiny import TinyFlowModel
from rlrunner.models.tiny_text import load_tiny_components
from rlrunner.recipe import ModelConfig
from rlrunner.sizing.activations import activation_bytes, decode_bytes
from rlrunner.sizing.memory import (
    ComponentPlan,
    ModelSizes,
    Part,
    StepGeometry,
    actor_plan,
    model_sizes,
    rollout_plan,
)

FAMILIES = ("sd3", "wan22_ti2v_5b", "qwen_image")
RECIPES = {"sd3": "sd3_nft_ocr", "wan22_ti2v_5b": "wan22_ti2v_5b_nft_ocr", "qwen_image": "qwen_image_nft_ocr"}
FAMILIES += ("zimage", "flux2_klein")
RECIPES |= {"zimage": "zimage_nft_ocr", "flux2_klein": "flux2_klein_nft_ocr"}
FAMILIES += ("flux1",)
RECIPES |= {"flux1": "flux1_dev_nft_ocr"}
A14B = "wan22_t2v_a14b"
FAMILIES += (A14B,)
RECIPES |= {"wan22_t2v_a14b": "wan22_t2v_a14b_nft_video_ocr"}
TINY_FOLDER = Path("examples/diffusion/models/tiny-ocr-flow")


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _model_cfg(model_type: str, family_cfg, precision: str):
    cfg = OmegaConf.structured(ModelConfig(model_type=model_type, precision=precision))
    cfg[model_type] = family_cfg
    return cfg


def config_only_copy(folder: Path, dest: Path) -> Path:
    """``model_index.json`` and every ``<component>/config.json`` of ``folder``, nothing else."""
    dest.mkdir()
    shutil.copy(folder / MODEL_INDEX, dest / MODEL_INDEX)
    for config in folder.glob(f"*/{CONFIG_FILE}"):
        (dest / config.parent.name).mkdir()
        shutil.copy(config, dest / config.parent.name / CONFIG_FILE)
    return dest


# ------------------------------------------------------------------------------ sizes equal a loaded model
@pytest.mark.parametrize("model_type", FAMILIES)
def test_sizes_from_configs_equal_the_loaded_model_in_bf16(load_tiny, tiny_dirs, tmp_path, model_type):
    model = load_tiny(model_type, dtype=torch.bfloat16)
    folder = config_only_copy(tiny_dirs(model_type), tmp_path / "configs")
    sizes = model_sizes(_model_cfg(model_type, model.cfg, "bf16"), folder)  # model.cfg: the family settings used

    named = dict(model.transformer.named_parameters())
    lora = [p for n, p in named.items() if ".default." in n]
    base = [p for n, p in named.items() if ".default." not in n and ".ema." not in n]
    assert sizes.denoiser_bytes == _bytes(base) + _bytes(model.transformer.buffers())
    assert sizes.lora_params == sum(p.numel() for p in lora) > 0
    assert sizes.text_encoder_bytes == {n: _bytes([*m.parameters(), *m.buffers()])
                                        for n, m in model.text_encoders.items()}
    assert sizes.vae_bytes == _bytes([*model.vae.parameters(), *model.vae.buffers()])
    assert sizes.shapes == model.shapes


def test_tiny_sizes_equal_the_shipped_model():
    family_cfg = OmegaConf.structured(ModelConfig).tiny
    model = TinyFlowModel.load(str(TINY_FOLDER), family_cfg, device=torch.device("cpu"), dtype=torch.float32)
    unet, text_encoder, _ = load_tiny_components(str(TINY_FOLDER))
    sizes = model_sizes(_model_cfg("tiny", family_cfg, "fp32"), TINY_FOLDER)
    assert sizes.denoiser_params + sum(p.numel() for p in text_encoder.parameters()) == 2_850_096  # the model card
    assert sizes.denoiser_bytes == _bytes([*unet.parameters(), *unet.buffers()])
    assert sizes.lora_params == sum(p.numel() for n, p in model.transformer.named_parameters() if ".default." in n)
    assert sizes.text_encoder_bytes == {"text_encoder": _bytes([*text_encoder.parameters(), *text_encoder.buffers()])}
    assert sizes.shapes.latent == model.latent_shape == (1, 32, 96)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_sample_shapes_are_what_the_family_produces(load_tiny, model_type):
    model = load_tiny(model_type)
    cond = model.encode_prompts(['a sign that says "hi"', "b"])
    for name, (shape, dtype) in model.shapes.cond.items():
        assert cond[name].dtype == (dtype or model.dtype)
        if name.startswith("prompt") and "prompt_mask" in cond:  # padded to the batch's longest prompt
            assert cond[name].shape[1] <= shape[0] and cond[name].shape[2:] == shape[1:]
        else:
            assert cond[name].shape[1:] == shape
    x0 = model.sample(cond, make_noise(model, 2), sampler="euler", num_steps=1)
    assert x0.shape[1:] == model.shapes.latent
    assert model.decode(x0).shape[1:] == model.shapes.pixels


# ------------------------------------------------------------------------------ hand-computed budget rules
def test_device_peak_takes_turns_swaps_and_overlaps():
    plans = {
        "actor": ComponentPlan([Part("actor", "weights", 10, swapped=True), Part("actor", "grads", 3, transient=True)],
                               activation_bytes=5),
        "rollout": ComponentPlan([Part("rollout", "weights", 8, swapped=True), Part("rollout", "encoders", 12),
                                  Part("rollout", "call", 2, transient=True),
                                  Part("rollout", "offloaded", 100, counted=False)], activation_bytes=4),
        "env": ComponentPlan([Part("env", "ocr", 0, counted=False)]),
    }
    components = ("actor", "env", "rollout")
    # turns: actor phase 10 + 3 + 5 + (8 + 12) = 38 > rollout phase 10 + (8 + 12 + 2 + 4) = 36
    assert device_peak(plans, components, swap=False, concurrent=False) == (38, "actor")
    # enable_offload: the idle model's swapped weights leave: actor phase 10 + 3 + 5 + 12 = 30, rollout 26
    assert device_peak(plans, components, swap=True, concurrent=False) == (30, "actor")
    # rollout_ahead: both at once, 10 + 3 + 5 + 8 + 12 + 2 + 4
    assert device_peak(plans, components, swap=False, concurrent=True) == (44, "actor + rollout")
    assert device_peak(plans, ("rollout",), swap=True, concurrent=False) == (26, "rollout")


def test_device_peak_counts_start_up_and_steps_that_take_turns():
    plans = {
        "actor": ComponentPlan([Part("actor", "weights", 10, swapped=True), Part("actor", "grads", 3, transient=True),
                                Part("actor", "sync", 7, transient=True, step="weight sync")], activation_bytes=5),
        "rollout": ComponentPlan([Part("rollout", "weights", 30, swapped=True)], activation_bytes=1),
    }
    # the sync buffer (7) comes after the update's activations (5): the actor adds 3 + max(5, 7) = 10
    assert plans["actor"].working_bytes() == 10
    # enable_offload: actor phase 10 + 10 = 20, rollout phase 30 + 1 = 31, but at start-up both are loaded: 40
    assert device_peak(plans, ("actor", "rollout"), swap=True, concurrent=False) == (40, "start-up (every model loaded)")
    # without offload the actor's phase holds the rollout's weights: 10 + 10 + 30 = 50
    assert device_peak(plans, ("actor", "rollout"), swap=False, concurrent=False) == (50, "actor")


def test_rollout_steps_take_turns_and_offloaded_parts_visit_for_theirs():
    from rlrunner.models.shapes import ActivationProfile

    sizes = _toy_sizes(text_encoder_bytes={"text_encoder": 5000}, vae_bytes=9000,
                       profile=ActivationProfile(sampling=10.0, decode=2.0), decode_batch_size=2)
    geometry = StepGeometry(samples=4, group_size=2, rollout_epochs=1, rollout_workers=1, rollout_cp=1, actor_ranks=1,
                            actor_cp=1, global_batch_size=4,
                            micro_batch_size=2, cfg_factor=1, num_logged_samples=0)
    decode = 2 * 8 * 8 * 2.0  # 2 samples a call, 8 x 8 pixels, 2 bytes a pixel
    sampling = 10 * 4 * 7 * 8 * 2  # 4 samples, s = 7, h = 8, bf16
    for offload_te, offload_vae, peak in ((False, False, sampling), (True, False, 5000),
                                          (False, True, decode + 9000)):
        family = OmegaConf.create({"offload_text_encoder": offload_te, "offload_vae": offload_vae})
        plan = rollout_plan(sizes, geometry, family)
        counted = {p.name: p.counted for p in plan.parts}
        assert counted["text encoder text_encoder"] is not offload_te and counted["VAE"] is not offload_vae
        assert plan.activation_bytes == peak, (offload_te, offload_vae, plan.activation_detail)


def _toy_sizes(**overrides) -> ModelSizes:
    from rlrunner.models.shapes import SampleShapes

    shapes = SampleShapes((4, 2, 2), {"emb": ((3, 8), None)}, (8, 8, 3), image_tokens=4, text_tokens=3)
    fields = {"dtype": torch.bfloat16, "denoiser_bytes": 800, "denoiser_params": 400, "text_encoder_bytes": {},
              "vae_bytes": 0, "lora_params": 10, "shapes": shapes, "hidden_size": 8, "num_layers": 2}
    return ModelSizes(**(fields | overrides))


def test_activation_formula_by_hand():
    sizes = _toy_sizes()  # s = 4 + 3 = 7 tokens, h = 8, L = 2, 2 bytes per element
    assert activation_bytes(sizes, 2, training=True, checkpointing=True) == (2 + 17) * 2 * 7 * 8 * 2
    assert activation_bytes(sizes, 2, training=True, checkpointing=False) == 17 * 2 * 2 * 7 * 8 * 2
    assert activation_bytes(sizes, 3, training=False, checkpointing=False) == 8 * 3 * 7 * 8 * 2
    assert activation_bytes(_toy_sizes(hidden_size=None), 2, training=True, checkpointing=True) is None
    # context parallelism splits the image tokens: s = 4 / 2 + 3 = 5 per rank at cp 2, 4 / 4 + 3 = 4 at cp 4
    assert activation_bytes(sizes, 2, training=True, checkpointing=True, context_parallel_size=2) == \
        (2 + 17) * 2 * 5 * 8 * 2
    assert activation_bytes(sizes, 3, training=False, checkpointing=False, context_parallel_size=4) == 8 * 3 * 4 * 8 * 2


def test_activation_profile_constants_by_hand():
    from rlrunner.models.shapes import ActivationProfile, SampleShapes

    # a family's measured constants replace 17 and 8; cross-attention text (Wan) leaves s = 4 image tokens
    sizes = _toy_sizes(profile=ActivationProfile(sampling=50.0, training=60.0, text_in_sequence=False))
    assert activation_bytes(sizes, 2, training=True, checkpointing=True) == (2 + 60) * 2 * 4 * 8 * 2
    assert activation_bytes(sizes, 3, training=False, checkpointing=False) == 50 * 3 * 4 * 8 * 2
    # the decode: decode_batch_size samples of min(frames, chunk) frames at `decode` bytes a pixel
    video = SampleShapes((4, 2, 2, 2), {}, (9, 8, 6, 3), image_tokens=8, text_tokens=3)
    profile = ActivationProfile(decode=100.0, decode_chunk_frames=4)
    assert decode_bytes(_toy_sizes(shapes=video, profile=profile, decode_batch_size=2)) == 2 * 4 * 8 * 6 * 100
    assert decode_bytes(_toy_sizes(decode_batch_size=3)) == 3 * 1 * 8 * 8 * 3072  # an image, the default decode


@pytest.mark.parametrize("checkpointing, cp", [(True, 1), (False, 1), (True, 2)])
def test_measured_constants_invert_the_formulas(checkpointing, cp):
    """The constants a simulation's activation bytes give (measured_constants) are those that make the formulas give
    those bytes back, by hand: 2 x 5 x 8 x 2 bytes per unit at cp 2 (s = 4 / 2 + 3), 2 x 7 x 8 x 2 at cp 1."""
    from rlrunner.models.shapes import ActivationProfile, SampleShapes
    from rlrunner.sizing.activations import measured_constants

    video = SampleShapes((4, 2, 2, 2), {}, (9, 8, 6, 3), image_tokens=4, text_tokens=3)
    sizes = _toy_sizes(shapes=video, profile=ActivationProfile(decode_chunk_frames=4), decode_batch_size=2)
    per_unit = 2 * (4 // cp + 3) * 8 * 2
    activations = {"rollout": 30 * per_unit, "update": (2 + 45) * per_unit if checkpointing else 45 * 2 * per_unit,
                   "decode": 2 * 4 * 8 * 6 * 700}
    constants = measured_constants(sizes, activations, sampling_batch=2, training_batch=2, checkpointing=checkpointing,
                                   rollout_cp=cp, actor_cp=cp)
    assert constants == {"sampling": 30.0, "training": 45.0, "decode": 700.0}
    measured = dataclasses.replace(sizes, profile=ActivationProfile(**constants, decode_chunk_frames=4))
    assert activation_bytes(measured, 2, training=False, checkpointing=False, context_parallel_size=cp) == \
        activations["rollout"]
    assert activation_bytes(measured, 2, training=True, checkpointing=checkpointing, context_parallel_size=cp) == \
        activations["update"]
    assert decode_bytes(measured) == activations["decode"]
    assert measured_constants(sizes, {"decode": 1}, sampling_batch=2, training_batch=2,
                              checkpointing=True).keys() == {"decode"}  # a phase the simulation lacks: left out


def test_fsdp2_shards_the_actor_over_its_ranks():
    geometry = StepGeometry(samples=16, group_size=4, rollout_epochs=1, rollout_workers=1, rollout_cp=1, actor_ranks=4,
                            actor_cp=1, global_batch_size=16,
                            micro_batch_size=2, cfg_factor=1, num_logged_samples=4)
    sizes = _toy_sizes(largest_block_bytes=300, non_block_bytes=200)
    ddp = {p.name: p.nbytes for p in actor_plan(sizes, geometry, "ddp", True).parts}
    fsdp = {p.name: p.nbytes for p in actor_plan(sizes, geometry, "fsdp2", True).parts}
    assert ddp["denoiser base weights"] == 800 and fsdp["denoiser base weights"] == 200
    assert ddp["AdamW state"] == 2 * 10 * 4 and fsdp["AdamW state"] == 2 * 10 * 4 // 4
    # the current block, the prefetched one and the next one's gather buffer, plus the layers no block holds
    assert fsdp["fsdp2 all-gathered weights"] == 3 * 300 + 200 and "fsdp2 all-gathered weights" not in ddp
    cp = {p.name: p.nbytes for p in actor_plan(sizes, dataclasses.replace(geometry, actor_cp=2), "fsdp2", True).parts}
    # Ulysses: 8 tensors of micro-batch 2 x (4 / 2 image + 3 text tokens) x h 8 in bf16
    assert cp["context-parallel all-to-all buffers"] == 8 * 2 * (2 + 3) * 8 * 2


# ------------------------------------------------------------------------------ the command line
@pytest.mark.parametrize("model_type", FAMILIES)
def test_plan_prints_a_table_for_each_gpu_recipe_from_a_config_only_folder(tiny_dirs, tmp_path, capsys, model_type):
    folder = config_only_copy(tiny_dirs(model_type), tmp_path / "configs")
    # the tiny A14B folder's 2 heads do not split over the recipe's 4 CP ranks (the recipe check says so); without
    # CP its 8 rollout workers need 8 prompts
    tiny_sized = ["actor.context_parallel_size=1", "rollout.context_parallel_size=1", "env.train.total_num_envs=64",
                  "actor.global_batch_size=64"] if model_type == A14B else []
    assert main([RECIPES[model_type], f"actor.model.model_path={folder}", *tiny_sized, "--device-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "devices 0" in out or "device 0" in out
    for row in ("denoiser base weights", "LoRA adapter ema", "AdamW state", "VAE", "text encoder text_encoder",
                "activations (estimate)", "peak (estimate)", "decoded pixels", "fits"):
        assert row in out, row


def test_wan_video_recipe_plans_frames(tiny_dirs, tmp_path, capsys):
    folder = config_only_copy(tiny_dirs("wan22_ti2v_5b"), tmp_path / "configs")
    assert main(["wan22_ti2v_5b_nft_video_ocr", f"actor.model.model_path={folder}"]) == 0
    out = capsys.readouterr().out
    # 1152 samples, 1 rollout worker: latents [1152, 48, 2, 32, 32] and 5 frames of 512x512 per sample
    assert "[1152, 48, 2, 32, 32] fp32" in out and "[1152, 5, 512, 512, 3] uint8" in out


def test_plan_counts_the_trajectory_states_an_algorithm_keeps(tiny_dirs, tmp_path, capsys):
    """FlowGRPO keeps a state before and after each trained step; NFT with rollout states keeps x_i and v_old."""
    folder = config_only_copy(tiny_dirs("sd3"), tmp_path / "configs")
    row = "trajectory states the algorithm keeps"
    assert main(["sd3_nft_ocr", f"actor.model.model_path={folder}"]) == 0
    assert row not in capsys.readouterr().out  # NFT on re-noised x0 keeps nothing more
    cases = {("algorithm.name=flow_grpo", "actor.model.sd3.train_sampler=euler",
              "algorithm.flow_grpo_sde_window_size=2"): 4,
             ("algorithm.nft_xcur_source=rollout", "algorithm.nft_timesteps_per_sample=3"): 6}
    for overrides, latents in cases.items():
        assert main(["sd3_nft_ocr", f"actor.model.model_path={folder}", *overrides]) == 0
        assert f"{latents} fp32 latents per sample" in capsys.readouterr().out, overrides


def test_plan_never_reads_weights(tmp_path, capsys):
    intact = main(["tiny_nft_ocr", "--device-memory", "1"])
    expected = capsys.readouterr().out
    folder = tmp_path / "tiny"
    shutil.copytree(TINY_FOLDER, folder)
    weights = sorted(folder.glob("*/*.safetensors"))
    assert weights
    for file in weights:
        file.write_bytes(b"not a safetensors file")
        os.chmod(file, 0)
    try:
        assert main(["tiny_nft_ocr", f"actor.model.model_path={folder}", "--device-memory", "1"]) == intact == 0
    finally:
        for file in weights:
            os.chmod(file, 0o644)
    assert capsys.readouterr().out == expected.replace(os.path.abspath(TINY_FOLDER), str(folder))  # recipe paths are absolute


def test_plan_warns_when_it_does_not_fit(capsys):
    assert main(["tiny_nft_ocr", "--device-memory", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out
    assert out.strip().splitlines()[-1].startswith("WARNING: device 0 need about")


def _edit_index(folder: Path, **entries) -> None:
    index = json.loads((folder / MODEL_INDEX).read_text())
    (folder / MODEL_INDEX).write_text(json.dumps(index | entries))


def test_plan_skips_a_tokenizer_class_this_environment_lacks(tmp_path, capsys):
    folder = config_only_copy(TINY_FOLDER, tmp_path / "tiny")
    _edit_index(folder, tokenizer=["transformers", "NoSuchTokenizer"])
    assert main(["tiny_nft_ocr", f"actor.model.model_path={folder}"]) == 0
    assert "peak (estimate)" in capsys.readouterr().out


@pytest.mark.parametrize(("setup", "message"), [
    ("missing_folder", "does not exist"),
    ("missing_index", "model_index.json is missing"),
    ("missing_config", "text_encoder/config.json is missing: text_encoder is listed in model_index.json"),
    ("hub_id", "is a hub id; the plan reads a local folder"),
    ("unknown_model_class", "names diffusers.NoSuchModel, which this environment cannot import"),
])
def test_plan_errors_are_one_line_with_exit_2(tmp_path, capsys, setup, message):
    folder = config_only_copy(TINY_FOLDER, tmp_path / "tiny")
    path = {"missing_folder": tmp_path / "nowhere", "hub_id": "org/name"}.get(setup, folder)
    if setup == "missing_index":
        (folder / MODEL_INDEX).unlink()
    if setup == "missing_config":
        (folder / "text_encoder" / CONFIG_FILE).unlink()
    if setup == "unknown_model_class":
        _edit_index(folder, unet=["diffusers", "NoSuchModel"])
    assert main(["tiny_nft_ocr", f"actor.model.model_path={path}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("rlrunner: error: ") and captured.err.count("\n") == 1
    assert message in captured.err


def test_plan_warns_when_ocr_gets_fewer_than_4_cpu_threads_per_env_worker(tiny_dirs, tmp_path, capsys):
    folder = config_only_copy(tiny_dirs("sd3"), tmp_path / "configs")
    warning = "WARNING: OCR (env.train.reward and env.eval.reward) gets 1 CPU thread(s) per env worker, fewer than 4"
    # sd3_nft_ocr as it shipped before cluster.env_threads: each env worker's one reserved CPU
    assert main(["sd3_nft_ocr", f"actor.model.model_path={folder}", "cluster.env_threads=reserved"]) == 0
    assert warning in capsys.readouterr().out.splitlines()[-1]
    assert main(["sd3_nft_ocr", f"actor.model.model_path={folder}", "cluster.env_threads=reserved",
                 "cluster.cpus_per_worker=4"]) == 0
    assert "WARNING" not in capsys.readouterr().out
    # as shipped: the node's CPUs shared by its env workers, sized at launch; the plan says so and does not warn
    assert main(["sd3_nft_ocr", f"actor.model.model_path={folder}"]) == 0
    out = capsys.readouterr().out
    assert "WARNING" not in out and "cluster.env_threads=node" in out

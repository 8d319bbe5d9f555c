"""Tiny random-weight diffusers pipelines written to disk, offline, for the model-family tests and the benches.

``write_tiny_<family>(directory)`` builds every component of the family's real diffusers pipeline from a config
(1-2 layers, head dim 8, hidden <= 32), with tokenizers built from an in-memory vocabulary (no hub access), and
saves the whole pipeline with the real ``Pipeline.save_pretrained``, so ``FlowModel.load(directory, ...)`` runs
the same ``from_pretrained`` code as for a hub id. Tests use the fixtures of tests/conftest.py (``tiny_dirs``,
``load_tiny``); the benches (``bench/rollout_overhead.py``, ``bench/gpu_folders.py``) import this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from family_helpers import clip_tokenizer, qwen_chat_tokenizer, qwen_tokenizer, t5_tokenizer


def _t5_encoder(vocab_size: int, d_model: int = 32):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=vocab_size, d_model=d_model, d_kv=8, d_ff=37, num_layers=1, num_heads=4,
                      relative_attention_num_buckets=8, decoder_start_token_id=0)
    return T5EncoderModel(config)


def write_tiny_sd3(directory: str | Path) -> Path:
    """StableDiffusion3Pipeline: SD3Transformer2DModel, AutoencoderKL (2x down), 2x CLIP + T5."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(sample_size=8, patch_size=1, in_channels=4, num_layers=1, attention_head_dim=8,
                                        num_attention_heads=2, caption_projection_dim=16, joint_attention_dim=32,
                                        pooled_projection_dim=32, out_channels=4)
    clip_cfg = CLIPTextConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=16, intermediate_size=37,
                              num_attention_heads=2, num_hidden_layers=2, vocab_size=80, projection_dim=16,
                              max_position_embeddings=16, hidden_act="gelu")
    vae = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(4, 8), layers_per_block=1,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035, sample_size=16)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        text_encoder=CLIPTextModelWithProjection(clip_cfg), tokenizer=clip_tokenizer(16),
        text_encoder_2=CLIPTextModelWithProjection(clip_cfg), tokenizer_2=clip_tokenizer(16),
        text_encoder_3=_t5_encoder(80), tokenizer_3=t5_tokenizer(),
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def write_tiny_wan(directory: str | Path) -> Path:
    """Wan2.2 TI2V-5B layout: WanTransformer3DModel (48 ch), residual AutoencoderKLWan (16x/4x), UMT5."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                                        in_channels=48, out_channels=48, text_dim=32, freq_dim=32, ffn_dim=32,
                                        num_layers=1, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                        rope_max_seq_len=32)
    vae = AutoencoderKLWan(base_dim=3, z_dim=48, in_channels=12, out_channels=12, is_residual=True, patch_size=2,
                           latents_mean=[0.1] * 48, latents_std=[2.0] * 48, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           scale_factor_spatial=16, scale_factor_temporal=4, temperal_downsample=[False, True, True])
    te_cfg = UMT5Config(vocab_size=80, d_model=32, d_kv=8, d_ff=37, num_layers=1, num_heads=4,
                        relative_attention_num_buckets=8, decoder_start_token_id=0)
    pipe = WanPipeline(
        transformer=transformer, vae=vae, text_encoder=UMT5EncoderModel(te_cfg), tokenizer=t5_tokenizer(),
        scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0),
        expand_timesteps=True,
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def _tiny_wan21_transformer(seed: int):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=16,
                                 out_channels=16, text_dim=32, freq_dim=32, ffn_dim=32, num_layers=1,
                                 cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def _write_tiny_wan21_layout(directory: str | Path, second_expert: bool) -> Path:
    """Wan2.1 T2V layout (16-channel 8x VAE, no expand_timesteps, UniPC at the Diffusers folders' flow_shift 3.0);
    with ``second_expert``, Wan2.2 A14B's: a second transformer and boundary_ratio 0.875 (at 2 steps of that
    schedule, sigmas 1 and 0.75, the pipeline switches expert at the second step)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    transformer = _tiny_wan21_transformer(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True], latents_mean=[0.1] * 16, latents_std=[2.0] * 16)
    te_cfg = UMT5Config(vocab_size=80, d_model=32, d_kv=8, d_ff=37, num_layers=1, num_heads=4,
                        relative_attention_num_buckets=8, decoder_start_token_id=0)
    experts = {"transformer_2": _tiny_wan21_transformer(1), "boundary_ratio": 0.875} if second_expert else {}
    pipe = WanPipeline(
        transformer=transformer, vae=vae, text_encoder=UMT5EncoderModel(te_cfg), tokenizer=t5_tokenizer(),
        scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0),
        **experts,
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def write_tiny_wan21(directory: str | Path) -> Path:
    """Wan2.1 T2V (1.3B / 14B) layout: one WanTransformer3DModel (16 ch), AutoencoderKLWan (8x/4x), UMT5."""
    return _write_tiny_wan21_layout(directory, second_expert=False)


def write_tiny_wan_a14b(directory: str | Path) -> Path:
    """Wan2.2 T2V-A14B layout: Wan2.1's components with a second expert (transformer_2, boundary_ratio 0.875)."""
    return _write_tiny_wan21_layout(directory, second_expert=True)


#: Qwen-Image's published scheduler config: shifted by exp(mu), mu from the image token count, stretched to end at
#: 0.02 before the final 0 (so the tiny folder exercises the pipeline's dynamic schedule)
QWEN_IMAGE_SCHEDULER = {"use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 0.9, "base_image_seq_len": 256,
                        "max_image_seq_len": 8192, "shift_terminal": 0.02, "time_shift_type": "exponential"}


def write_tiny_qwen_image(directory: str | Path) -> Path:
    """QwenImagePipeline: QwenImageTransformer2DModel, AutoencoderKLQwenImage (8x), Qwen2.5-VL text encoder."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=1,
                                              attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
                                              guidance_embeds=False, axes_dims_rope=(4, 2, 2))
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True], latents_mean=[0.1] * 4, latents_std=[2.0] * 4)
    tokenizer = qwen_tokenizer()
    te_cfg = Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": len(tokenizer), "rope_theta": 1000000.0,
                     "bos_token_id": None, "eos_token_id": len(tokenizer) - 1,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"}},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=16, vocab_size=len(tokenizer), vision_start_token_id=len(tokenizer) - 3,
        vision_end_token_id=len(tokenizer) - 2, vision_token_id=len(tokenizer) - 1,
    )
    pipe = QwenImagePipeline(transformer=transformer, vae=vae, text_encoder=Qwen2_5_VLForConditionalGeneration(te_cfg),
                             tokenizer=tokenizer, scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER))
    pipe.save_pretrained(directory)
    return Path(directory)


#: Z-Image's published scheduler config (static shift 6.0; Z-Image-Turbo's is 3.0)
ZIMAGE_SCHEDULER = {"shift": 6.0, "use_dynamic_shifting": False}


def write_tiny_zimage(directory: str | Path) -> Path:
    """ZImagePipeline: ZImageTransformer2DModel (1 refiner + 1 main layer), AutoencoderKL (2x down), Qwen3."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(0)
    transformer = ZImageTransformer2DModel(in_channels=4, dim=16, n_layers=1, n_refiner_layers=1, n_heads=2,
                                           n_kv_heads=2, cap_feat_dim=16, axes_dims=[2, 2, 4])
    vae = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(4, 8), layers_per_block=1,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.1159, scaling_factor=0.3611, sample_size=16)
    tokenizer = qwen_chat_tokenizer()
    te_cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=256)
    pipe = ZImagePipeline(transformer=transformer, vae=vae, text_encoder=Qwen3Model(te_cfg), tokenizer=tokenizer,
                          scheduler=FlowMatchEulerDiscreteScheduler(**ZIMAGE_SCHEDULER))
    pipe.save_pretrained(directory)
    return Path(directory)


#: FLUX.2-klein's published scheduler config: exp(mu)-shifted, mu from compute_empirical_mu (the pipeline's)
FLUX2_KLEIN_SCHEDULER = {"shift": 3.0, "use_dynamic_shifting": True, "time_shift_type": "exponential",
                         "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 4096}


def write_tiny_flux2_klein(directory: str | Path, is_distilled: bool = False) -> Path:
    """Flux2KleinPipeline (klein base; ``is_distilled`` for the step-distilled klein): Flux2Transformer2DModel (1
    double + 2 single blocks), AutoencoderKLFlux2 (2x down, 2x2 patches, batch-norm statistics set to non-trivial
    values), Qwen3 with 27 layers (the pipeline stacks layers 9, 18, 27)."""
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    transformer = Flux2Transformer2DModel(in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=8,
                                          num_attention_heads=2, joint_attention_dim=48, timestep_guidance_channels=16,
                                          axes_dims_rope=(2, 2, 2, 2), guidance_embeds=False)
    vae = AutoencoderKLFlux2(block_out_channels=(4, 8), layers_per_block=1, latent_channels=4, norm_num_groups=1,
                             down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                             use_quant_conv=False, use_post_quant_conv=False, sample_size=16)
    with torch.no_grad():
        vae.bn.running_mean.uniform_(-0.5, 0.5)
        vae.bn.running_var.uniform_(0.5, 2.0)
    tokenizer = qwen_chat_tokenizer()
    te_cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=16, num_hidden_layers=27,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=256)
    pipe = Flux2KleinPipeline(transformer=transformer, vae=vae, text_encoder=Qwen3ForCausalLM(te_cfg),
                              tokenizer=tokenizer, scheduler=FlowMatchEulerDiscreteScheduler(**FLUX2_KLEIN_SCHEDULER),
                              is_distilled=is_distilled)
    pipe.save_pretrained(directory)
    return Path(directory)


#: FLUX.1-dev's published scheduler config (shifted by exp(mu), mu from the image token count), kept with its other
#: configs under bench/model_configs/; schnell's turns the dynamic shift off
FLUX1_DEV_SCHEDULER = Path(__file__).resolve().parents[2] / "bench/model_configs/flux.1-dev/scheduler/scheduler_config.json"
FLUX1_SCHNELL_SCHEDULER = {"use_dynamic_shifting": False, "base_shift": 0.5, "max_shift": 1.15,
                           "base_image_seq_len": 256, "max_image_seq_len": 4096, "shift": 1.0}


def write_tiny_flux1(directory: str | Path, schnell: bool = False) -> Path:
    """FluxPipeline: FluxTransformer2DModel (1 double + 1 single block), AutoencoderKL (2x down), CLIP + T5; FLUX.1-dev
    layout (guidance embedding, its scheduler), or schnell's (neither)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel

    if schnell:
        scheduler = FlowMatchEulerDiscreteScheduler(**FLUX1_SCHNELL_SCHEDULER)
    else:
        scheduler = FlowMatchEulerDiscreteScheduler.from_config(json.loads(FLUX1_DEV_SCHEDULER.read_text()))

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                         attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
                                         pooled_projection_dim=16, guidance_embeds=not schnell,
                                         axes_dims_rope=(4, 2, 2))
    clip_cfg = CLIPTextConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=16, intermediate_size=37,
                              num_attention_heads=2, num_hidden_layers=1, vocab_size=80, projection_dim=16,
                              max_position_embeddings=16, hidden_act="gelu")
    vae = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(4, 8), layers_per_block=1,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.1159, scaling_factor=0.3611, sample_size=16)
    pipe = FluxPipeline(
        transformer=transformer, vae=vae, scheduler=scheduler,
        text_encoder=CLIPTextModel(clip_cfg), tokenizer=clip_tokenizer(16),
        text_encoder_2=_t5_encoder(80), tokenizer_2=t5_tokenizer(),
    )
    pipe.save_pretrained(directory)
    return Path(directory)


TINY_WRITERS: dict[str, Callable[[str | Path], Path]] = {
    "sd3": write_tiny_sd3,
    "wan22_ti2v_5b": write_tiny_wan,
    "wan21_t2v": write_tiny_wan21,
    "wan22_t2v_a14b": write_tiny_wan_a14b,
    "qwen_image": write_tiny_qwen_image,
    "zimage": write_tiny_zimage,
    "flux2_klein": write_tiny_flux2_klein,
    "flux1": write_tiny_flux1,
}

#: per-family settings that fit the tiny components (pixel sizes map to 8x8 / 2x2x2 / 8x8 latents); the schedule is
#: each pipeline's own (shift: null)
TINY_FAMILY_SETTINGS: dict[str, dict[str, Any]] = {
    "sd3": {"resolution": 16, "max_sequence_length": 8},
    "wan22_ti2v_5b": {"resolution": 32, "num_frames": 5, "max_sequence_length": 8},
    "wan21_t2v": {"resolution": 32, "num_frames": 5, "max_sequence_length": 8},
    "wan22_t2v_a14b": {"resolution": 32, "num_frames": 5, "max_sequence_length": 8},
    "qwen_image": {"resolution": 32, "max_sequence_length": 256},
    "zimage": {"resolution": 16, "max_sequence_length": 64},
    "flux2_klein": {"resolution": 32, "max_sequence_length": 64},
    "flux1": {"resolution": 16, "max_sequence_length": 8},
}


def tiny_family_cfg(model_type: str, **overrides: Any):
    """``actor.model.<model_type>`` for the tiny pipelines: LoRA 4/8, 2 steps, plus ``overrides``."""
    from omegaconf import OmegaConf

    from rlrunner.models.settings import FamilyConfig

    settings = {"lora_rank": 4, "lora_alpha": 8, "num_steps": 2, "eval_num_steps": 2,
                **TINY_FAMILY_SETTINGS[model_type], **overrides}
    return OmegaConf.structured(FamilyConfig(**settings))


#: a small run of any family: 2 prompts x group 2 per step, micro-batches of 2, fp32, JPEG compressibility reward
#: (it varies on any image, so random-weight models train); the family's own tiny settings on top
FAMILY_RUN = ("runner.max_steps=2", "runner.save_interval=1", "runner.val_check_interval=0",
              "runner.val_before_train=false", "runner.sample_log_interval=0", "algorithm.group_size=2",
              "env.train.total_num_envs=4", "env.eval.total_num_envs=2", "actor.global_batch_size=4",
              "actor.micro_batch_size=2", "actor.optim.lr=1e-2", "algorithm.nft_tau=[1.0,0.5,0,2]",
              "algorithm.awm_timesteps_per_sample=2", "env.train.reward.model=jpeg_compressibility",
              "env.eval.reward.model=jpeg_compressibility", "actor.model.precision=fp32", "cluster.worker_timeout_s=300")

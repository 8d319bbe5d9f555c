"""Fixtures for the model-family tests: tiny random-weight diffusers pipelines written to disk, offline.

``write_tiny_<family>(directory)`` builds every component of the family's real diffusers pipeline from a config
(1-2 layers, head dim 8, hidden <= 32), with tokenizers built from an in-memory vocabulary (no hub access), and
saves the whole pipeline with the real ``Pipeline.save_pretrained``, so ``FlowModel.load(directory, ...)`` runs
the same ``from_pretrained`` code as for a hub id. Tests use the fixtures (``tiny_dirs``, ``load_tiny``), never
``import conftest``; ``bench/rollout_overhead.py`` imports the writers by file path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from family_helpers import clip_tokenizer, qwen_tokenizer, t5_tokenizer


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


TINY_WRITERS: dict[str, Callable[[str | Path], Path]] = {
    "sd3": write_tiny_sd3,
    "wan22_ti2v_5b": write_tiny_wan,
    "wan21_t2v": write_tiny_wan21,
    "wan22_t2v_a14b": write_tiny_wan_a14b,
    "qwen_image": write_tiny_qwen_image,
}

#: per-family settings that fit the tiny components (pixel sizes map to 8x8 / 2x2x2 / 8x8 latents); the schedule is
#: each pipeline's own (shift: null)
TINY_FAMILY_SETTINGS: dict[str, dict[str, Any]] = {
    "sd3": {"resolution": 16, "max_sequence_length": 8},
    "wan22_ti2v_5b": {"resolution": 32, "num_frames": 5, "max_sequence_length": 8},
    "wan21_t2v": {"resolution": 32, "num_frames": 5, "max_sequence_length": 8},
    "wan22_t2v_a14b": {"resolution": 32, "num_frames": 5, "max_sequence_length": 8},
    "qwen_image": {"resolution": 32, "max_sequence_length": 256},
}


def tiny_family_cfg(model_type: str, **overrides: Any):
    """``actor.model.<model_type>`` for the tiny pipelines: LoRA 4/8, 2 steps, plus ``overrides``."""
    from omegaconf import OmegaConf

    from rlrunner.config.schema import FamilyConfig

    settings = {"lora_rank": 4, "lora_alpha": 8, "num_steps": 2, "eval_num_steps": 2,
                **TINY_FAMILY_SETTINGS[model_type], **overrides}
    return OmegaConf.structured(FamilyConfig(**settings))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> Callable[[str], Path]:
    """``tiny_dirs(model_type)``: the family's tiny pipeline folder, written once per session."""
    torch.set_num_threads(1)
    cache: dict[str, Path] = {}

    def get(model_type: str) -> Path:
        if model_type not in cache:
            cache[model_type] = TINY_WRITERS[model_type](tmp_path_factory.mktemp(model_type))
        return cache[model_type]

    return get


@pytest.fixture
def load_tiny(tiny_dirs) -> Callable[..., Any]:
    """``load_tiny(model_type, path=None, dtype=float32, **family_overrides)``: ``<Family>.load`` on CPU.

    ``path`` defaults to the family's tiny pipeline folder; the class comes from the registry.
    """
    from rlrunner.models import model_class

    def load(model_type: str, path: str | Path | None = None, dtype: torch.dtype = torch.float32, **overrides: Any):
        cfg = tiny_family_cfg(model_type, **overrides)
        path = tiny_dirs(model_type) if path is None else path
        return model_class(model_type).load(str(path), cfg, device=torch.device("cpu"), dtype=dtype)

    return load


@pytest.fixture(scope="session")
def tiny_model_cfg(tiny_dirs) -> Callable[[str], Any]:
    """``tiny_model_cfg(model_type)``: ``actor.model`` (fp32, CPU) on the family's tiny folder, as workers take it."""
    from omegaconf import OmegaConf

    from rlrunner.config.schema import ModelConfig

    def make(model_type: str) -> Any:
        cfg = OmegaConf.structured(ModelConfig(model_path=str(tiny_dirs(model_type)), model_type=model_type,
                                               precision="fp32", device="cpu"))
        cfg[model_type] = tiny_family_cfg(model_type)
        return cfg

    return make

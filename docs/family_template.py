"""Template of a model family: copy this file to ``rlrunner/models/<family>.py``, rename the class, and change each
hook to what your pipeline does (``docs/adding_a_family.md`` walks through it).

It is a working family: it wraps ``diffusers.StableDiffusion3Pipeline`` (the simplest pipeline we support) and
implements every hook a family may override (:data:`rlrunner.models.build.FAMILY_HOOKS`), in the order they run:
first the build hooks (:mod:`rlrunner.models.build`, called once by ``FlowModel.load``), then the run hooks
(called by sampling and training). ``tests/models/test_family_template.py`` keeps it in step with that list and
builds it on a tiny random-weight SD3 folder, where it samples exactly as ``SD3FlowModel`` does.

Mirror the diffusers pipeline line by line: every number here (timestep scale, CLIP length, how latents are decoded)
is the pipeline's, and the family test compares a rollout with the pipeline's own call on the same latents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rlrunner.models.base import Cond, FlowModel
from rlrunner.models.lora import MMDIT_LORA_TARGETS, last_block_text_stream
from rlrunner.models.pixels import check_divisible, decode_scaled_latents, resolution_hw
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.shapes import SampleShapes


@dataclass
class TemplateSettings(FamilyConfig):
    """``actor.model.template``: the recipe section of this family, the shared family keys with the defaults of the
    model (those its pipeline uses) and any keys of its own; a recipe's unknown key under it is an error."""

    resolution: Any = 512
    max_sequence_length: int = 256


class TemplateFlowModel(FlowModel):
    """A family behind :class:`~rlrunner.models.base.FlowModel`.

    Say what it holds, with shapes: conditioning ``prompt_embeds [B, 77 + max_sequence_length, D]``,
    ``pooled_prompt_embeds [B, P]``; latents ``[B, C, H/8, W/8]``.
    """

    # ------------------------------------------------------------------ what the family is (class attributes)
    #: the recipe's ``actor.model.model_type`` (also the key of its settings section ``actor.model.<model_type>``)
    model_type = "template"
    #: the type of that section (a FamilyConfig dataclass): what ``actor.model.template`` holds and defaults to
    settings_type = TemplateSettings
    #: the diffusers pipeline class of the model folder (``model_index.json``'s ``_class_name``)
    pipeline_class_name = "StableDiffusion3Pipeline"
    #: the pipeline's LoRA loader mixin (``diffusers.loaders``): exported adapters load with ``load_lora_weights``
    lora_loader_class_name = "SD3LoraLoaderMixin"
    #: the VAE class (loaded in float32) and the text encoders the prompts go through
    vae_class_name = "AutoencoderKL"
    text_encoder_names = ("text_encoder", "text_encoder_2", "text_encoder_3")
    #: the denoiser's modules that get LoRA adapters (the names a published trainer of this model targets)
    lora_target_modules = MMDIT_LORA_TARGETS
    #: the guidance kinds the pipeline has; the first is what ``guidance: auto`` means (guidance_kind may refine it)
    guidance_kinds = ("cfg",)
    #: the most prompt tokens its text encoder reads, and what sets that (``check_pipeline`` refuses more)
    max_text_tokens, max_text_tokens_source = 512, "T5's"

    # ------------------------------------------------------------------ build hooks, in call order
    @classmethod
    def load_pipeline(cls, model_path: str, dtype: torch.dtype, denoiser_only: bool) -> Any:
        """1. Load the pipeline. Assumes nothing. The default loads ``pipeline_class_name`` from the folder or hub
        id (VAE in float32; with ``denoiser_only``, the transformer and scheduler alone): keep it unless the folder
        is not a diffusers pipeline (the tiny family writes its own)."""
        return super().load_pipeline(model_path, dtype, denoiser_only)

    def check_pipeline(self, pipe: Any) -> None:
        """2. Refuse settings the pipeline cannot run. May assume ``self.cfg`` (the family settings), ``device``,
        ``dtype`` and the loaded ``pipe``; nothing is held yet. One line: the key, the value, what is expected. The
        default refuses a ``max_sequence_length`` over ``max_text_tokens``: add the family's own refusals after it."""
        super().check_pipeline(pipe)

    @classmethod
    def guidance_kind(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> str:
        """3. The guidance kind in force (``cfg``, ``embedded`` or ``none``). May assume only the config dicts of the
        folder (``configs["model_index"]``, ``configs["transformer"]``, ...), which are empty when the recipe check
        sees a hub id: then decide from the recipe. Runs at recipe check and once per build, never while sampling
        (the result lives in ``self.resolved_guidance``). Read a config flag here when the folder's variant decides
        (FLUX.1: ``guidance_embeds``; FLUX.2-klein: ``is_distilled``)."""
        return super().guidance_kind(family_cfg, configs)

    def denoiser(self, pipe: Any) -> nn.Module:
        """4. The module ``_predict_velocity`` calls and LoRA adapts. May assume ``self.cfg`` and ``pipe``. Wrap
        several denoisers in one module here (Wan2.2 A14B's experts)."""
        return pipe.transformer

    @classmethod
    def sample_shapes(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> SampleShapes:
        """5. Per-sample shapes at ``family_cfg``'s settings from the component configs alone (the recipe check and
        the memory plan call it without weights): the pipeline's own rules for the latent, text and token sizes."""
        height, width = resolution_hw(family_cfg.resolution)
        transformer = configs["transformer"]
        factor, patch = 2 ** (len(configs["vae"]["block_out_channels"]) - 1), int(transformer["patch_size"])
        check_divisible(height, width, factor * patch, cls.model_type)
        latent = (int(transformer["in_channels"]), height // factor, width // factor)
        # CLIP's length (77 when the text encoders were not loaded) plus the T5 tokens
        clip_tokens = int(configs.get("text_encoder", {}).get("max_position_embeddings", 77))
        text_tokens = clip_tokens + int(family_cfg.max_sequence_length)
        cond = {"prompt_embeds": ((text_tokens, int(transformer["joint_attention_dim"])), None),
                "pooled_prompt_embeds": ((int(transformer["pooled_projection_dim"]),), None)}
        return SampleShapes(latent, cond, pixels=(height, width, 3), text_tokens=text_tokens,
                            image_tokens=(latent[1] // patch) * (latent[2] // patch))

    def configure(self, pipe: Any) -> None:
        """6. Read what else the family needs from the pipeline. May assume everything above is held:
        ``self.pipe``, ``transformer``, ``vae``, ``text_encoders``, ``shapes``, ``resolved_guidance``. Nothing here;
        Wan reads ``expand_timesteps`` and turns on VAE tiling."""

    @classmethod
    def lora_exclude_modules(cls, denoiser: nn.Module) -> tuple[str, ...]:
        """7. LoRA targets to skip: modules whose output the model discards (they would get no gradient, which DDP
        cannot reduce). May assume the frozen denoiser, possibly on the meta device (the memory plan counts the
        adapters on it). SD3's last block computes no text output, so its text queries get none."""
        return last_block_text_stream(denoiser, ("add_q_proj",))

    # ------------------------------------------------------------------ run hooks (the model is built)
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """Text conditioning, every tensor batch-first on ``self.device`` in the model dtype: the pipeline's own
        ``encode_prompt`` with the text encoders on the device for the call."""
        with self.text_encoders_on_device():
            embeds, _, pooled, _ = self.pipe.encode_prompt(
                prompt=list(prompts), prompt_2=None, prompt_3=None, device=self.device,
                do_classifier_free_guidance=False, max_sequence_length=int(self.cfg.max_sequence_length),
            )
        return {"prompt_embeds": embeds.to(self.dtype), "pooled_prompt_embeds": pooled.to(self.dtype)}

    def _predict_velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: Cond,
                          guidance: torch.Tensor | None = None) -> torch.Tensor:
        """One denoiser call: latents ``[B, C, h, w]``, ``t`` ``[B]`` sigmas in [0, 1] (1 = noise) -> the velocity
        ``eps - x0`` ``[B, C, h, w]``. Pass the timestep as the pipeline does (SD3: ``1000 * sigma``); ``guidance``
        is the ``[B]`` scale of ``embedded`` guidance (None otherwise)."""
        return self.transformer(hidden_states=latents.to(self.dtype), timestep=t.float() * 1000,
                                encoder_hidden_states=cond["prompt_embeds"],
                                pooled_projections=cond["pooled_prompt_embeds"], return_dict=False)[0]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """Latents to uint8 pixels ``[B, H, W, 3]`` (``[B, F, H, W, 3]`` for video), in float32 as the pipeline."""
        with self.vae_on_device() as vae:
            return decode_scaled_latents(vae, latents, self.device, self.decode_batch_size)

    def schedule_kwargs(self, num_steps: int) -> dict[str, Any]:
        """What the pipeline passes to ``scheduler.set_timesteps`` for ``num_steps`` (FLUX: sigmas and a token-count
        ``mu``); SD3 passes the step count alone."""
        return super().schedule_kwargs(num_steps)

    def concat_cond(self, conds: list[Cond]) -> Cond:
        """Conditionings concatenated along the batch; pad ragged text here (Qwen-Image, Z-Image)."""
        return super().concat_cond(conds)

    def combine_guidance(self, v_neg: torch.Tensor, v_cond: torch.Tensor, guidance_scale: float) -> torch.Tensor:
        """The pipeline's rule for the ``cfg`` halves (``[B, *latent_shape]`` each); set ``guidance_combine`` to
        its formula when it is not ``neg + s (cond - neg)`` (Qwen-Image rescales, Z-Image uses ``s - 1``)."""
        return super().combine_guidance(v_neg, v_cond, guidance_scale)

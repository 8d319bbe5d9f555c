"""Helpers of the model tests and of bench/rollout_overhead.py and bench/gpu_folders.py (which import this file by
path): in-memory tokenizers of the tiny (and the device check's) pipelines, starting noise, prompt batches encoded
once per distinct prompt, and the reference rollout through the diffusers pipeline itself.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlrunner.models import EMA_ADAPTER, FlowModel
from rlrunner.models.base import Cond

CHARS = string.ascii_lowercase + string.digits


def clip_tokenizer(max_length: int) -> Any:
    """A CLIP tokenizer over lowercase letters and digits, built in memory (no hub access)."""
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in CHARS:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def t5_tokenizer() -> Any:
    """A T5 (sentencepiece unigram) tokenizer over lowercase letters and digits, built in memory."""
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + c, -1.0) for c in CHARS] + [(c, -2.0) for c in CHARS] + [("\u2581", -3.0)]
    return T5TokenizerFast(vocab=pieces, extra_ids=0)


def qwen_tokenizer() -> Any:
    """A byte-level Qwen2 tokenizer with the chat-template special tokens, built in memory."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return tok


#: Qwen3's chat template for one user turn and the generation prompt (Qwen3 adds an empty think block only when
#: thinking is off)
QWEN3_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def qwen_chat_tokenizer() -> Any:
    """:func:`qwen_tokenizer` with Qwen3's chat template (Z-Image, FLUX.2-klein call ``apply_chat_template``)."""
    tok = qwen_tokenizer()
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    return tok


def make_noise(model: FlowModel, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Starting noise ``[batch_size, *latent_shape]`` (float32, on ``model.device``) from ``generator``."""
    gen_device = generator.device if generator is not None else model.device
    noise = torch.randn((batch_size, *model.latent_shape), generator=generator, device=gen_device)
    return noise.to(model.device)


def encode_prompt_batch(model: FlowModel, prompts: list[str]) -> Cond:
    """Like ``model.encode_prompts`` but runs the text encoders once per distinct prompt (groups repeat them)."""
    unique = list(dict.fromkeys(prompts))
    cond = model.encode_prompts(unique)
    index = torch.tensor([unique.index(p) for p in prompts], device=model.device)
    return {k: v.index_select(0, index.to(v.device)) for k, v in cond.items()}


def _negative(negative: Cond | None, **keys: str) -> dict[str, torch.Tensor]:
    """The pipeline's negative-prompt arguments (``argument=cond_key``), none without guidance."""
    return {} if negative is None else {arg: negative[key] for arg, key in keys.items()}


def _sd3_call(model: Any, cond: Cond, noise: torch.Tensor, guidance_scale: float,
              negative: Cond | None) -> dict[str, Any]:
    return {"prompt_embeds": cond["prompt_embeds"], "pooled_prompt_embeds": cond["pooled_prompt_embeds"],
            "latents": noise, "height": model.height, "width": model.width, "guidance_scale": guidance_scale,
            **_negative(negative, negative_prompt_embeds="prompt_embeds",
                        negative_pooled_prompt_embeds="pooled_prompt_embeds")}


def _wan_call(model: Any, cond: Cond, noise: torch.Tensor, guidance_scale: float,
              negative: Cond | None) -> dict[str, Any]:
    return {"prompt_embeds": cond["prompt_embeds"], "latents": noise, "height": model.height, "width": model.width,
            "num_frames": model.num_frames, "guidance_scale": guidance_scale,
            **_negative(negative, negative_prompt_embeds="prompt_embeds")}


def _qwen_image_call(model: Any, cond: Cond, noise: torch.Tensor, guidance_scale: float,
                     negative: Cond | None) -> dict[str, Any]:
    from rlrunner.models.qwen_image import pack_latents

    return {"prompt_embeds": cond["prompt_embeds"], "prompt_embeds_mask": cond["prompt_mask"],
            "latents": pack_latents(noise), "height": model.height, "width": model.width,
            "true_cfg_scale": guidance_scale,
            **_negative(negative, negative_prompt_embeds="prompt_embeds", negative_prompt_embeds_mask="prompt_mask")}


def _unpack_2x2_latents(model: Any, latents: torch.Tensor) -> torch.Tensor:
    from rlrunner.models.qwen_image import unpack_latents

    _, h, w = model.latent_shape
    return unpack_latents(latents, h, w)


def _zimage_call(model: Any, cond: Cond, noise: torch.Tensor, guidance_scale: float,
                 negative: Cond | None) -> dict[str, Any]:
    """The pipeline's ``guidance_scale`` is ours minus 1 (it guides as ``pos + g (pos - neg)``, 0 = off)."""
    from rlrunner.models.ragged_text import unstack_ragged

    kwargs = {"prompt_embeds": unstack_ragged(cond["prompt_embeds"], cond["prompt_mask"]), "latents": noise,
              "height": model.height, "width": model.width, "guidance_scale": guidance_scale - 1.0,
              "cfg_truncation": float(model.cfg.cfg_truncation), "cfg_normalization": float(model.cfg.cfg_normalization),
              "max_sequence_length": int(model.cfg.max_sequence_length)}
    if negative is not None:
        kwargs["negative_prompt_embeds"] = unstack_ragged(negative["prompt_embeds"], negative["prompt_mask"])
    return kwargs


def _flux2_klein_call(model: Any, cond: Cond, noise: torch.Tensor, guidance_scale: float,
                      negative: Cond | None) -> dict[str, Any]:
    return {"prompt_embeds": cond["prompt_embeds"], "latents": noise, "height": model.height, "width": model.width,
            "guidance_scale": guidance_scale, "max_sequence_length": int(model.cfg.max_sequence_length),
            **_negative(negative, negative_prompt_embeds="prompt_embeds")}


def _flux2_klein_latents(model: Any, latents: torch.Tensor) -> torch.Tensor:
    """The pipeline returns de-normalised VAE latents: back to the transformer's normalised patches."""
    from rlrunner.models.flux2_klein import batch_norm_stats, patchify

    mean, std = batch_norm_stats(model.vae)
    return (patchify(latents) - mean) / std


def _flux1_call(model: Any, cond: Cond, noise: torch.Tensor, guidance_scale: float,
                negative: Cond | None) -> dict[str, Any]:
    """FLUX.1: the scale goes to ``guidance_scale`` (embedded) or ``true_cfg_scale`` with the negative (cfg)."""
    from rlrunner.models.qwen_image import pack_latents

    scale = {"guidance_scale": guidance_scale} if model.guidance == "embedded" else {"true_cfg_scale": guidance_scale}
    return {"prompt_embeds": cond["prompt_embeds"], "pooled_prompt_embeds": cond["pooled_prompt_embeds"],
            "latents": pack_latents(noise), "height": model.height, "width": model.width, **scale,
            **_negative(negative, negative_prompt_embeds="prompt_embeds",
                        negative_pooled_prompt_embeds="pooled_prompt_embeds")}


#: per family: the ``pipe(...)`` arguments that reproduce ``sample(cond, noise, guidance_scale=g)`` (negative:
#: ``model.negative_cond``, None without guidance), and how to read the pipeline's output latents back into
#: ``[B, *latent_shape]``
PIPELINE_CALLS: dict[str, tuple[Callable[..., dict[str, Any]], Callable[[Any, torch.Tensor], torch.Tensor]]] = {
    "sd3": (_sd3_call, lambda model, latents: latents),
    "wan22_ti2v_5b": (_wan_call, lambda model, latents: latents),
    "wan21_t2v": (_wan_call, lambda model, latents: latents),
    "wan22_t2v_a14b": (_wan_call, lambda model, latents: latents),
    "qwen_image": (_qwen_image_call, _unpack_2x2_latents),
    "zimage": (_zimage_call, lambda model, latents: latents),
    "flux2_klein": (_flux2_klein_call, _flux2_klein_latents),
    "flux1": (_flux1_call, _unpack_2x2_latents),
}


@torch.no_grad()
def pipeline_pixels(model: Any, cond: Cond, noise: torch.Tensor, *, num_steps: int) -> np.ndarray:
    """The unguided Euler rollout of the EMA adapter decoded by the diffusers pipeline itself (its own latent
    de-normalisation and postprocessing), as uint8 ``[B, H, W, 3]``: what ``model.decode(model.sample(...))`` gives
    when the family decodes as its pipeline does."""
    call_kwargs, _ = PIPELINE_CALLS[model.model_type]
    original = model.pipe.scheduler
    model.pipe.scheduler = reference_scheduler(model)
    try:
        with model.use_adapter(EMA_ADAPTER):
            images = model.pipe(**call_kwargs(model, cond, noise, 1.0, None), num_inference_steps=num_steps,
                                output_type="np", return_dict=False)[0]
    finally:
        model.pipe.scheduler = original
    return (np.asarray(images) * 255).round().astype(np.uint8)


def reference_scheduler(model: Any) -> Any:
    """The scheduler the reference pipeline call samples with: the pipeline's own when it is a flow-matching Euler
    scheduler and the recipe leaves ``shift`` to the pipeline's rule (the test then checks that rule too); Euler on
    the pipeline scheduler's own grid when that scheduler is another solver (Wan's UniPC: the same schedule, a
    different integrator than ``sampler: euler``); Euler on the plain shifted grid for a recipe's ``shift``."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    own = model.pipe.scheduler
    shift = model.cfg.shift
    if shift is None and type(own) is FlowMatchEulerDiscreteScheduler:
        return own
    if shift is None:
        grid_fn = lambda num_steps: _solver_grid(own, num_steps)
    else:
        grid_fn = lambda num_steps: np.linspace(1.0, 0.0, num_steps + 1)[:-1]

    class GridEulerScheduler(FlowMatchEulerDiscreteScheduler):
        def set_timesteps(self, num_inference_steps=None, device=None, sigmas=None, mu=None, timesteps=None):
            num_steps = num_inference_steps or len(sigmas)
            super().set_timesteps(sigmas=list(map(float, grid_fn(num_steps))), device=device)
            if shift is None:  # the loop gets the own scheduler's timesteps (UniPC: int64), as the pipeline's does
                self.timesteps = _solver_timesteps(own, num_steps).to(self.timesteps.device)

        def step(self, model_output, timestep, sample, *args, **kwargs):
            # Euler steps by its step index (the pipeline sets the begin index); it refuses integer timesteps
            return super().step(model_output, torch.as_tensor(timestep).float(), sample, *args, **kwargs)

    return GridEulerScheduler(shift=float(shift) if shift is not None else 1.0)


def _fresh(scheduler: Any, num_steps: int) -> Any:
    fresh = type(scheduler).from_config(scheduler.config)
    fresh.set_timesteps(num_steps, device="cpu")
    return fresh


def _solver_grid(scheduler: Any, num_steps: int) -> np.ndarray:
    """The first ``num_steps`` sigmas of ``scheduler``'s own grid at ``num_steps`` steps (a fresh copy)."""
    return np.asarray(_fresh(scheduler, num_steps).sigmas, dtype=np.float64)[:num_steps]


def _solver_timesteps(scheduler: Any, num_steps: int) -> torch.Tensor:
    """The ``num_steps`` timesteps (in their dtype) of ``scheduler``'s own grid at ``num_steps`` steps."""
    return _fresh(scheduler, num_steps).timesteps[:num_steps]


@torch.no_grad()
def pipeline_sample(model: Any, cond: Cond, noise: torch.Tensor, *, num_steps: int, adapter: str | None = EMA_ADAPTER,
                    guidance_scale: float = 1.0) -> torch.Tensor:
    """The rollout of ``model.sample`` (Euler) through the diffusers pipeline's own ``__call__``; with
    ``guidance_scale > 1``, the pipeline's own guidance with ``model.negative_cond`` as the negative prompt.

    The pipeline samples on its own schedule (:func:`reference_scheduler`), so the result equals
    ``sample(..., sampler="euler")`` only if the family computes that schedule as its pipeline does.
    Returns x0 ``[B, *latent_shape]``.
    """
    call_kwargs, from_pipeline_latents = PIPELINE_CALLS[model.model_type]
    original = model.pipe.scheduler
    model.pipe.scheduler = reference_scheduler(model)
    try:
        with model.use_adapter(adapter):
            negative = model.negative_cond(noise.shape[0]) if guidance_scale > 1 and model.guidance == "cfg" else None
            kwargs = call_kwargs(model, cond, noise, guidance_scale, negative)
            out = model.pipe(**kwargs, num_inference_steps=num_steps, output_type="latent", return_dict=False)[0]
    finally:
        model.pipe.scheduler = original
    return from_pipeline_latents(model, out)

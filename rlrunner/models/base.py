"""The one interface every model family implements, and the LoRA plumbing they share.

A :class:`FlowModel` wraps a rectified-flow denoiser (``x_t = (1 - t) x0 + t eps``, the network predicts
``v = eps - x0``) plus whatever turns prompts into conditioning and latents into pixels. Workers only ever
talk to this interface, so SD3 / Wan / Qwen-Image / tiny differences never leak out of ``models/``.

Two LoRA adapters live on one denoiser: ``default`` (trained by the actor) and ``ema`` (the "old" policy used
for rollouts and for ``v_old``). Switching between them touches only the LoRA layers collected once at build
time, never peft's module-wide ``set_adapter`` (which walks every module and toggles ``requires_grad``).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from rlrunner.algorithms.samplers import sample_flow, sigma_schedule

TRAINED_ADAPTER = "default"
EMA_ADAPTER = "ema"
ADAPTERS = (TRAINED_ADAPTER, EMA_ADAPTER)

Cond = dict[str, torch.Tensor]


class FlowModel(abc.ABC):
    """Base class of the model families.

    Subclasses set ``self.transformer`` (an ``nn.Module`` whose forward the subclass calls in
    :meth:`_predict_velocity`), ``self.lora_target_modules`` and implement the abstract methods.
    """

    #: diffusers pipeline class whose ``save_lora_weights`` / ``load_lora_weights`` read our adapters
    pipeline_class_name: str = ""
    lora_target_modules: tuple[str, ...] = ()

    def __init__(self, family_cfg: Any, *, device: torch.device, dtype: torch.dtype) -> None:
        self.cfg = family_cfg
        self.device = device
        self.dtype = dtype
        self.transformer: nn.Module
        self._lora_layers: list[nn.Module] = []

    # ------------------------------------------------------------------ family-specific
    @property
    @abc.abstractmethod
    def latent_shape(self) -> tuple[int, ...]:
        """Shape of one sample's latent: ``(C, H, W)`` for images, ``(C, F, H, W)`` for video."""

    @abc.abstractmethod
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """Text conditioning for ``prompts``; every tensor is batch-first ``[B, ...]`` on ``self.device``."""

    @abc.abstractmethod
    def _predict_velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: Cond) -> torch.Tensor:
        """One denoiser call with whatever adapter is active. ``t``: ``[B]`` sigmas in [0, 1]."""

    @abc.abstractmethod
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """Latents to uint8 pixels: ``[B, H, W, 3]`` for images, ``[B, F, H, W, 3]`` for video."""

    # ------------------------------------------------------------------ shared behaviour
    @property
    def is_video(self) -> bool:
        return len(self.latent_shape) == 4

    def velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: Cond, adapter: str | None = TRAINED_ADAPTER):
        """``v(x_t, t)`` with ``adapter`` active (``None`` = base model, adapters off).

        latents: ``[B, *latent_shape]``; t: ``[B]`` in [0, 1] (1 = noise). Returns ``[B, *latent_shape]``.
        """
        with self.use_adapter(adapter):
            return self._predict_velocity(latents, t, cond)

    @torch.no_grad()
    def sample(
        self,
        cond: Cond,
        noise: torch.Tensor,
        *,
        sampler: str,
        num_steps: int,
        guidance_scale: float = 1.0,
        negative_cond: Cond | None = None,
        adapter: str | None = EMA_ADAPTER,
        return_trajectory: bool = False,
    ):
        """Integrate the flow ODE from ``noise`` (t = 1) to a clean latent (t = 0).

        Classifier-free guidance (``guidance_scale > 1``) runs the conditional and ``negative_cond`` halves in
        one batched call: ``v = v_neg + g (v_cond - v_neg)``.
        """
        if guidance_scale > 1.0 and negative_cond is None:
            raise ValueError(f"guidance_scale={guidance_scale} needs a negative prompt conditioning (negative_cond)")
        sigmas = sigma_schedule(num_steps, shift=float(self.cfg.shift), device=noise.device)
        use_cfg = guidance_scale > 1.0

        def velocity_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            if not use_cfg:
                return self._predict_velocity(x.to(self.dtype), t, cond)
            both = {k: torch.cat([negative_cond[k], cond[k]]) for k in cond}
            v_neg, v_cond = self._predict_velocity(torch.cat([x, x]).to(self.dtype), torch.cat([t, t]), both).chunk(2)
            return v_neg + guidance_scale * (v_cond - v_neg)

        with self.use_adapter(adapter):
            return sample_flow(velocity_fn, noise, sigmas, sampler=sampler, return_trajectory=return_trajectory)

    # ------------------------------------------------------------------ LoRA adapters
    def _add_lora_adapters(self, rank: int, alpha: int, init: str | bool = "gaussian") -> None:
        """Put the ``default`` and ``ema`` LoRA adapters (same init) on the denoiser, base frozen."""
        from peft import LoraConfig
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.transformer.requires_grad_(False)
        lora_config = LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights=init,
                                 target_modules=list(self.lora_target_modules))
        for name in ADAPTERS:
            self.transformer.add_adapter(lora_config, adapter_name=name)
        self._lora_layers = [m for m in self.transformer.modules() if isinstance(m, BaseTunerLayer)]
        self.load_lora_state_dict(EMA_ADAPTER, self.lora_state_dict(TRAINED_ADAPTER))
        for pname, param in self.transformer.named_parameters():
            param.requires_grad_(f".{TRAINED_ADAPTER}." in pname)
        self._activate(TRAINED_ADAPTER)

    def _activate(self, adapter: str | None) -> None:
        for layer in self._lora_layers:
            if adapter is None:
                layer._disable_adapters = True
            else:
                layer._disable_adapters = False
                layer._active_adapter = [adapter]

    @contextlib.contextmanager
    def use_adapter(self, adapter: str | None) -> Iterator[None]:
        """Run the block with ``adapter`` active (``None``: base model), then restore ``default``."""
        if adapter is not None and adapter not in ADAPTERS:
            raise ValueError(f"unknown adapter {adapter!r}; valid: {list(ADAPTERS)} or None (base model)")
        self._activate(adapter)
        try:
            yield
        finally:
            self._activate(TRAINED_ADAPTER)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.transformer.parameters() if p.requires_grad]

    def adapter_parameters(self, adapter: str) -> list[torch.Tensor]:
        """The adapter's LoRA tensors in a fixed order (the same order for both adapters)."""
        return [p for n, p in self.transformer.named_parameters() if f".{adapter}." in n]

    def lora_state_dict(self, adapter: str) -> dict[str, torch.Tensor]:
        """LoRA tensors of ``adapter`` with the adapter name stripped from the keys (detached copies, CPU)."""
        return {n.replace(f".{adapter}.", "."): p.detach().cpu().clone()
                for n, p in self.transformer.named_parameters() if f".{adapter}." in n}

    @torch.no_grad()
    def load_lora_state_dict(self, adapter: str, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` (as returned by :meth:`lora_state_dict`) into ``adapter``; keys and shapes must match."""
        params = {n.replace(f".{adapter}.", "."): p for n, p in self.transformer.named_parameters()
                  if f".{adapter}." in n}
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or unexpected:
            raise ValueError(f"LoRA state does not match the {adapter!r} adapter: missing {missing[:3]}"
                             f"{'...' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
                             f"{'...' if len(unexpected) > 3 else ''} (different model or LoRA targets?)")
        for name, param in params.items():
            if param.shape != state[name].shape:
                raise ValueError(f"LoRA tensor {name} has shape {tuple(state[name].shape)}, the model expects "
                                 f"{tuple(param.shape)} (different lora_rank or model?)")
            param.copy_(state[name].to(param.device, param.dtype))

    def save_lora(self, directory: str, adapter: str = TRAINED_ADAPTER) -> None:
        """Write ``adapter`` so that diffusers' ``pipe.load_lora_weights(directory)`` loads it."""
        import diffusers
        from diffusers.utils import convert_state_dict_to_diffusers
        from peft.utils import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.transformer, adapter_name=adapter)
        state = {k: v.detach().cpu().contiguous() for k, v in convert_state_dict_to_diffusers(state).items()}
        pipeline_cls = getattr(diffusers, self.pipeline_class_name)
        pipeline_cls.save_lora_weights(directory, transformer_lora_layers=state, safe_serialization=True)

"""Where a model's parts live between phases: text encoders and VAE on the device only while they work
(``offload_text_encoder`` / ``offload_vae``), the denoiser parked in host memory while a collocated worker runs, and
parts a worker never uses freed."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch
from torch import nn


class ComponentPlacement:
    """Placement methods of :class:`~rlrunner.models.base.FlowModel`, which provides what they use: ``device``,
    ``transformer``, ``text_encoders``, ``vae``, an optional ``pipe`` and the family settings ``_option``."""

    @contextlib.contextmanager
    def text_encoders_on_device(self) -> Iterator[None]:
        """Text encoders on ``self.device`` for the block; with ``offload_text_encoder`` they return to CPU."""
        if not self.text_encoders:
            raise RuntimeError("the text encoders were released (release_text_encoders); this worker cannot "
                               "encode prompts, pass it precomputed conditioning instead")
        offload = self._option("offload_text_encoder")
        for module in self.text_encoders.values():
            module.to(self.device)
        try:
            yield
        finally:
            if offload:
                for module in self.text_encoders.values():
                    module.to("cpu")
                _empty_cache(self.device)

    @contextlib.contextmanager
    def vae_on_device(self) -> Iterator[nn.Module]:
        """The VAE on ``self.device`` for the block; with ``offload_vae`` it returns to CPU afterwards."""
        if self.vae is None:
            raise RuntimeError("the VAE was released (release_vae); this worker cannot decode latents")
        self.vae.to(self.device)
        try:
            yield self.vae
        finally:
            if self._option("offload_vae"):
                self.vae.to("cpu")
                _empty_cache(self.device)

    def offload_transformer(self, offload: bool) -> None:
        """Denoiser (with its adapters) to host memory, or back to ``self.device``: collocated workers take turns."""
        self.transformer.to("cpu" if offload else self.device)
        if offload:
            _empty_cache(self.device)

    def release_text_encoders(self) -> None:
        """Free the text encoders (workers that only receive precomputed conditioning): drop every reference,
        collect them, and return their device memory to the device."""
        self.text_encoders.clear()
        self._drop_pipeline_components("text_encoder")
        _collect(self.device)

    def release_vae(self) -> None:
        """Free the VAE (workers that never decode), as :meth:`release_text_encoders` frees the text encoders."""
        self.vae = None
        self._drop_pipeline_components("vae")
        _collect(self.device)

    def _drop_pipeline_components(self, prefix: str) -> None:
        pipe = getattr(self, "pipe", None)
        for name in list(getattr(pipe, "components", {})):
            if name.startswith(prefix):
                setattr(pipe, name, None)

    def empty_device_cache(self) -> None:
        """Hand the memory the device's caching allocator keeps for freed tensors back to the device (after FSDP2
        freed each block's full weights), so a collocated worker can use it."""
        _empty_cache(self.device)

    def _place_components(self, denoiser_on_host: bool = False) -> None:
        """Initial placement: transformer on device (in host memory with ``denoiser_on_host``); text encoders / VAE
        on device unless offloaded."""
        if not denoiser_on_host:  # FSDP2 then moves it to the device shard by shard
            self.transformer.to(self.device)
        for module in self.text_encoders.values():
            module.requires_grad_(False).eval().to("cpu" if self._option("offload_text_encoder") else self.device)
        if self.vae is not None:
            self.vae.requires_grad_(False).eval().to("cpu" if self._option("offload_vae") else self.device)


def _collect(device: torch.device) -> None:
    """Collect modules just dropped (reference cycles included) and hand their cached device memory back."""
    gc.collect()
    _empty_cache(device)


def _empty_cache(device: torch.device) -> None:
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and backend is not None and hasattr(backend, "empty_cache"):
        backend.empty_cache()

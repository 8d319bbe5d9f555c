"""A model family built at full size from a config-only folder, on fake CPU tensors (no memory, no weights).

Fake **CPU** tensors (torch's ``FakeTensorMode``) are what the simulator runs on: they allocate what a device would
and pick the same SDPA kernel family as CUDA's flash attention, where ``meta`` (and fake CUDA) fall back to the math
kernel and would keep fp32 ``s x s`` scores. The family's own build hooks run (:func:`rlrunner.models.build.
build_family`), with two replaced: step 1 makes the pipeline from the folder's config files on the meta device (so
peft's LoRA goes in on meta, where its ``.to()`` works), and the placement turns every meta tensor into a fake one
of the same shape and dtype. The device mesh and the process group (torch's fake backend) are made outside the
fake mode, as torch needs.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

from rlrunner.models.meta import ModelFolderError, _fp32_module_names, build_on_meta, read_components
from rlrunner.sizing.tracker import MemoryTracker

DENOISER_PARTS = ("transformer", "transformer_2", "unet")
VAE = "vae"


def _cast(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``module`` in ``dtype`` but the sub-modules its library keeps in float32 (as ``from_pretrained`` loads)."""
    keep = _fp32_module_names(module, dtype)
    module.to(dtype)
    for name, sub in module.named_modules():
        if keep & set(name.split(".")):
            sub.to(torch.float32)
    return module


def meta_pipeline(family: type, model_path: str, dtype: torch.dtype, denoiser_only: bool) -> Any:
    """The family's diffusers pipeline with every model component on the meta device (VAE float32, the rest in
    ``dtype``; ``denoiser_only``: the denoiser alone, as the actor loads it), built from config files only."""
    import diffusers

    index, components = read_components(model_path)
    pipeline_cls = getattr(diffusers, family.pipeline_class_name)
    kwargs: dict[str, Any] = {}
    skipped: dict[str, dict[str, Any]] = {}
    for name in list(inspect.signature(pipeline_cls.__init__).parameters)[1:]:
        entry = index.get(name)
        if name in components:
            if denoiser_only and name not in DENOISER_PARTS:
                skipped[name] = components[name].config
                kwargs[name] = None
                continue
            kwargs[name] = _cast(build_on_meta(components[name], dtype), torch.float32 if name == VAE else dtype)
        elif isinstance(entry, list) and entry[0] == "diffusers" and "Scheduler" in entry[1]:
            scheduler_cls = getattr(diffusers, entry[1])
            try:
                kwargs[name] = scheduler_cls.from_pretrained(model_path, subfolder=name)
            except OSError:  # a folder without the scheduler's config: its defaults (the grid holds no memory)
                kwargs[name] = scheduler_cls()
        elif entry is not None and not isinstance(entry, list):
            kwargs[name] = entry  # the pipeline's own settings (Wan's expand_timesteps, boundary_ratio)
        else:
            kwargs[name] = None  # tokenizers and processors: no memory (prompts are not encoded here)
    try:
        pipe = pipeline_cls(**kwargs)
    except (TypeError, ValueError, AttributeError) as err:
        raise ModelFolderError(f"{model_path}: {pipeline_cls.__name__} cannot be built from its config files "
                               f"({str(err).splitlines()[0]})") from None
    pipe.skipped_configs = skipped
    return pipe


def materialize(module: nn.Module, fake_mode: FakeTensorMode | None, tracker: MemoryTracker, *,
                on_host: bool = False) -> None:
    """Replace every meta parameter and buffer of ``module`` by a fake CPU tensor of its shape and dtype (a real
    one of zeros without ``fake_mode``), counted by ``tracker`` as parameters (``on_host``: kept in host memory,
    counted once moved to the device)."""
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # meta tensor (kept alive, so its id stays its own) ->
    # its fake one: a tied weight (T5's shared embeddings) stays one tensor, as from_pretrained loads it

    def fake_of(meta: torch.Tensor, make: Any) -> torch.Tensor:
        if id(meta) not in made:
            made[id(meta)] = (meta, make(torch.zeros_like(meta, device="cpu")))
            tracker.track(made[id(meta)][1], "parameters", on_host=on_host)
        return made[id(meta)][1]

    with fake_mode or contextlib.nullcontext(), tracker.paused():
        for sub in module.modules():
            for name, param in list(sub._parameters.items()):
                if param is not None and param.is_meta:
                    sub._parameters[name] = fake_of(param, lambda t, p=param: nn.Parameter(
                        t, requires_grad=p.requires_grad))
            for name, buffer in list(sub._buffers.items()):
                if buffer is not None and buffer.is_meta:
                    sub._buffers[name] = fake_of(buffer, lambda t: t)


def fake_family(family: type, fake_mode: FakeTensorMode | None, tracker: MemoryTracker) -> type:
    """``family`` with build step 1 from config files on meta and a placement that makes fake tensors."""

    class Fake(family):
        @classmethod
        def load_pipeline(cls, model_path: str, dtype: torch.dtype, denoiser_only: bool) -> Any:
            return meta_pipeline(family, model_path, dtype, denoiser_only)

        def setup_denoiser(self) -> None:
            with torch.device("meta"):  # LoRA on meta, where peft's .to() works; materialized with the rest
                super().setup_denoiser()

        def _place_components(self, denoiser_on_host: bool = False) -> None:
            # every part fake, on the simulated device but what waits in host memory: the offloaded text encoders
            # and VAE, and the denoiser with denoiser_on_host
            # (FSDP2 brings it to the device module by module: simulate.py's _sharded_from_host)
            parts = [(m, "offload_text_encoder") for m in self.text_encoders.values()] + [(self.vae, "offload_vae")]
            for part, offload in parts:
                if part is not None:
                    materialize(part, fake_mode, tracker, on_host=self._option(offload))
                    part.requires_grad_(False).eval()
            materialize(self.transformer, fake_mode, tracker, on_host=denoiser_on_host)

        @contextlib.contextmanager
        def vae_on_device(self) -> Iterator[nn.Module]:
            with _on_device_for_the_block(tracker, [self.vae], self._option("offload_vae")):
                yield self.vae  # fake tensors do not move: the tracker counts where they are

        @contextlib.contextmanager
        def text_encoders_on_device(self) -> Iterator[None]:
            with _on_device_for_the_block(tracker, list(self.text_encoders.values()),
                                          self._option("offload_text_encoder")):
                yield

        def offload_transformer(self, offload: bool) -> None:
            """Host memory is not the device's: the simulator counts an offload as the device freed."""

    Fake.__name__ = Fake.__qualname__ = family.__name__
    return Fake


@contextlib.contextmanager
def _on_device_for_the_block(tracker: MemoryTracker, modules: list[nn.Module], offloaded: bool) -> Iterator[None]:
    """``modules`` counted on the device for the block; back in host memory after it when ``offloaded``."""
    for module in modules:
        tracker.move(module, to_host=False)
    try:
        yield
    finally:
        if offloaded:
            for module in modules:
                tracker.move(module, to_host=True)


def build_fake_model(model_cfg: Any, fake_mode: FakeTensorMode | None, tracker: MemoryTracker, *, denoiser_only: bool,
                     dtype: torch.dtype, denoiser_on_host: bool = False) -> Any:
    """``model_cfg``'s family at its settings (LoRA, gradient checkpointing) on fake CPU tensors in ``dtype``,
    counted by ``tracker`` (``fake_mode`` None: real tensors of zeros; ``denoiser_on_host``: the denoiser counted as
    host memory, as the FSDP2 actor loads it). Call it outside the fake mode (the meta build runs there)."""
    from rlrunner.models import model_class

    family_cfg = model_cfg[model_cfg.model_type]
    return fake_family(model_class(model_cfg.model_type), fake_mode, tracker).load(
        str(model_cfg.model_path), family_cfg, device=torch.device("cpu"), dtype=dtype, denoiser_only=denoiser_only,
        denoiser_on_host=denoiser_on_host)


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[bool]:
    """A default process group of ``world_size`` ranks on torch's fake backend (this process is rank 0; collectives
    return at once); yields whether one was formed (one rank forms none, as the actor does)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world_size <= 1:
        yield False
        return
    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process; the simulator needs its own")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield True
    finally:
        dist.destroy_process_group()


def outside_fake(fn: Any) -> Any:
    """``fn`` run with the fake mode lifted (the device mesh is built from real tensors)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():
            return fn(*args, **kwargs)

    return run

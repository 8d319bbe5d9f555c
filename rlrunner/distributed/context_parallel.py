"""Context parallelism: one sample's sequence split over a group of ranks, through diffusers' own ``_cp_plan`` hooks.
No Ray here.

The ranks of a group form a ``dp × cp`` mesh (:func:`parallel_mesh`, dims ``("dp", "ring", "ulysses")``, rank
``r`` at ``dp = r // cp``): the ``cp`` ranks of one CP group hold the same samples, and the denoiser's ``_cp_plan``
(declared by diffusers on Wan, FLUX.1, FLUX.2, Qwen-Image, LTX-2) splits its token sequence among them at the first
block and gathers it after ``proj_out``. Between the two, attention runs as

- ``ulysses``: an all-to-all trades the sequence split for a head split, so each rank attends over the whole
  sequence with ``heads / cp`` heads (the head count must divide by ``cp``), then trades back;
- ``ring``: each rank keeps its queries and the key/value blocks travel round the ring; partial results merge by
  their log-sum-exp, which only some attention backends return (not ``native``).

Either runs only on an attention backend that diffusers' registry marks context-parallel (``_flash_3`` and
``_native_math``, for instance, are not: under them the hooks' attention would silently attend within each slice);
:func:`cp_backends` reads that registry, the recipe check asks it of the backend the workers will import diffusers
with (:func:`configured_backend`), and :func:`apply_context_parallel` of each processor's backend in the worker.

Both have a backward. diffusers' own ``ModelMixin.enable_parallelism`` cannot be used here: it builds its mesh
over ``torch.accelerator.device_count()`` devices (none on a CPU) and over the whole world, where a ``dp × cp``
mesh needs the CP groups only; :func:`apply_context_parallel` does what it does on our mesh. Its "anything" modes
(uneven splits) have no backward and are not used: the sequence must divide by ``cp``
(:func:`sequence_problem` says the nearest size that does).

Gradients: the output is gathered (and its gradient sliced back) on every rank of a CP group, so each rank's
backward yields its own slice's share of the group's gradient, and the group's gradient is their *sum*
(:attr:`rlrunner.distributed.parallelize.Engine.gradient_scale`: the loss times ``cp``, so that DDP's and FSDP2's mean
over all ``dp·cp`` ranks is the mean over the ``dp`` groups of that sum).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

CP_MODES = ("ulysses", "ring")
#: context-parallel backends of diffusers' registry whose forward op raises on ``return_lse=True`` (diffusers 0.42.1
#: ``_native_attention_forward_op``, ``_npu_attention_forward_op``), which ring attention asks for; the registry does
#: not tell them apart, and ``enable_parallelism`` accepts them for ring only to fail at the first step
NO_LSE_BACKENDS = frozenset({"native", "_native_npu"})
MESH_DIMS = ("dp", "ring", "ulysses")


def mesh_shape(world_size: int, context_parallel_size: int, mode: str) -> tuple[int, int, int]:
    """``(dp, ring, ulysses)`` of ``world_size`` ranks in CP groups of ``context_parallel_size``."""
    if mode not in CP_MODES:
        raise ValueError(f"context parallel mode {mode!r} is not valid; choose one of {list(CP_MODES)}")
    if context_parallel_size < 1 or world_size % context_parallel_size:
        raise ValueError(f"context_parallel_size={context_parallel_size} does not divide the {world_size} ranks of "
                         f"the group into whole CP groups")
    dp = world_size // context_parallel_size
    return (dp, context_parallel_size, 1) if mode == "ring" else (dp, 1, context_parallel_size)


def parallel_mesh(device_type: str, world_size: int, context_parallel_size: int, mode: str) -> Any:
    """The ``dp × cp`` :class:`~torch.distributed.device_mesh.DeviceMesh` of the default process group (dims
    :data:`MESH_DIMS`); one mesh serves FSDP2 (all ranks, :func:`flat_mesh`) and the CP hooks (``ring × ulysses``)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, mesh_shape(world_size, context_parallel_size, mode), mesh_dim_names=MESH_DIMS)


def flat_mesh(mesh: Any) -> Any:
    """All ranks of ``mesh`` as one dimension (what FSDP2 shards over)."""
    return mesh[MESH_DIMS]._flatten("dp_cp")


def has_cp_plan(denoiser_class: type) -> bool:
    return getattr(denoiser_class, "_cp_plan", None) is not None


def apply_context_parallel(module: nn.Module, mesh: Any) -> None:
    """Register diffusers' CP hooks of ``module._cp_plan`` and its attention processors' parallel config on ``mesh``
    (from :func:`parallel_mesh`), as ``ModelMixin.enable_parallelism`` would on a mesh of its own, first refusing
    a backend it cannot run the mode on (:func:`check_backends`). Call before ``fully_shard`` (FSDP2) on the same
    module."""
    from diffusers.hooks.context_parallel import apply_context_parallel as register_hooks
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig

    if not has_cp_plan(type(module)):
        raise ValueError(f"{type(module).__name__} declares no _cp_plan: context parallelism needs a denoiser whose "
                         f"diffusers class has one")
    ring, ulysses = mesh["ring"].size(), mesh["ulysses"].size()
    check_backends(module, "ring" if ring > 1 else "ulysses")
    config = ParallelConfig(context_parallel_config=ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses,
                                                                          mesh=mesh))
    rank = torch.distributed.get_rank()
    config.setup(rank, torch.distributed.get_world_size(), next(module.parameters()).device, mesh=mesh)
    for processor in _cp_processors(module):
        processor._parallel_config = config
    module._parallel_config = config
    register_hooks(module, config.context_parallel_config, module._cp_plan)


def _cp_processors(module: nn.Module) -> list[Any]:
    """The attention processors of ``module`` that take a parallel config (those the CP hooks reach)."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    processors = [getattr(sub, "processor", None) for sub in module.modules()
                  if isinstance(sub, (Attention, AttentionModuleMixin))]
    return [p for p in processors if p is not None and hasattr(p, "_parallel_config")]


def check_backends(module: nn.Module, mode: str) -> None:
    """Refuse (one line) when an attention processor of ``module`` runs on a backend diffusers cannot run CP
    ``mode`` on, as this process's diffusers resolves it: the processor's own backend, else the registry's active
    one (``DIFFUSERS_ATTN_BACKEND`` when diffusers was imported here, which on a worker is the worker's, not the
    driver's)."""
    for backend in sorted({_backend_name(getattr(p, "_attention_backend", None)) for p in _cp_processors(module)}):
        if problem := backend_problem(backend, mode, f"context_parallel_mode={mode}"):
            raise ValueError(f"{type(module).__name__}: {problem}; set DIFFUSERS_ATTN_BACKEND on the workers")


def cp_backends(mode: str) -> list[str]:
    """The attention backends diffusers runs CP ``mode`` on: those its registry marks context-parallel (what
    ``enable_parallelism`` accepts), for ring less :data:`NO_LSE_BACKENDS`."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    capable = _AttentionBackendRegistry._supports_context_parallel
    return sorted(b for b in capable if mode != "ring" or b not in NO_LSE_BACKENDS)


def backend_problem(backend: str, mode: str, what: str) -> str | None:
    """Why CP ``mode`` (``what`` names it, e.g. the recipe key) cannot run on attention ``backend``, naming the
    backends it can run on, or None."""
    fits = cp_backends(mode)
    if backend in fits:
        return None
    if mode == "ring" and backend in cp_backends("ulysses"):
        return f"{what} needs an attention backend that returns the log-sum-exp, and {backend!r} does not; " \
               f"those that do: {', '.join(fits)} (or use ulysses mode)"
    return f"{what} needs an attention backend that diffusers marks context-parallel, and {backend!r} is not one; " \
           f"those that are: {', '.join(fits)}"


def splits_text(denoiser_class: type) -> bool:
    """Whether the class's ``_cp_plan`` splits the text tokens (``encoder_hidden_states``) too, not only the latent's
    (FLUX.1, FLUX.2, Qwen-Image: yes; Wan: no)."""
    plan = getattr(denoiser_class, "_cp_plan", None) or {}
    return any(isinstance(inputs, dict) and "encoder_hidden_states" in inputs for inputs in plan.values())


def sequence_problem(tokens: int, heads: int | None, cp: int, mode: str, what: str) -> str | None:
    """Why ``cp`` cannot split a sequence of ``tokens`` (``what`` names it) over ``heads`` heads, or None."""
    if cp <= 1:
        return None
    if mode == "ulysses" and heads is not None and heads % cp:
        fits = [d for d in range(1, heads + 1) if heads % d == 0]
        return f"Ulysses splits the {heads} attention heads over the CP group, and {heads} is not divisible by {cp} " \
               f"(degrees that divide it: {fits})"
    if tokens % cp:
        below, above = tokens // cp * cp, (tokens // cp + 1) * cp
        return f"{what} has {tokens} tokens, not divisible by context parallel size {cp}; the nearest that are: " \
               f"{below} or {above}"
    return None


def denoiser_class(pipeline_class_name: str) -> type | None:
    """The denoiser class a diffusers pipeline declares for its ``transformer`` (None: no such pipeline or argument)."""
    import inspect
    import typing

    import diffusers

    pipeline = getattr(diffusers, pipeline_class_name, None) if pipeline_class_name else None
    parameter = inspect.signature(pipeline.__init__).parameters.get("transformer") if pipeline else None
    if parameter is None:
        return None
    return next((c for c in typing.get_args(parameter.annotation) or (parameter.annotation,) if isinstance(c, type)
                 and c is not type(None)), None)


def configured_backend() -> str:
    """The attention backend processes started from here import diffusers with (``DIFFUSERS_ATTN_BACKEND``, diffusers'
    default ``native``): what the recipe check asks of, before any worker exists."""
    import os

    return os.environ.get("DIFFUSERS_ATTN_BACKEND", "native")


def _backend_name(backend: Any) -> str:
    """A processor's backend (None: the registry's active one, set from ``DIFFUSERS_ATTN_BACKEND`` when this process
    imported diffusers) as its registry name."""
    if backend is None:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry

        backend, _ = _AttentionBackendRegistry.get_active_backend()
    return str(getattr(backend, "value", backend))

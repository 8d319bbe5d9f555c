"""Context parallelism: one sample's sequence split over a group of ranks, through diffusers' own ``_cp_plan`` hooks.
No Ray here.

The ranks of a group form a ``dp × cp`` mesh (:func:`parallel_mesh`, dims ``("dp", "ring", "ulysses")``, rank
``r`` at ``dp = r // cp``): the ``cp`` ranks of one CP group hold the same samples, and the denoiser's ``_cp_plan``
(declared by diffusers on Wan, FLUX.1, FLUX.2, Qwen-Image, LTX-2) splits its token sequence among them at the first
block and gathers it after ``proj_out``. Between the two, attention runs as

- ``ulysses``: an all-to-all trades the sequence split for a head split, so each rank attends over the whole
  sequence with ``heads / cp`` heads (the head count must divide by ``cp``), then trades back;
- ``ring``: each rank keeps its queries and the key/value blocks travel round the ring; partial results merge by
  their log-sum-exp, which only some attention backends return (:data:`RING_BACKENDS`; not ``native``).

Both have a backward. diffusers' own ``ModelMixin.enable_parallelism`` cannot be used here: it builds its mesh
over ``torch.accelerator.device_count()`` devices (none on a CPU) and over the whole world, where a ``dp × cp``
mesh needs the CP groups only; :func:`apply_context_parallel` does what it does on our mesh. Its "anything" modes
(uneven splits) have no backward and are not used: the sequence must divide by ``cp``
(:func:`sequence_problem` says the nearest size that does).

Gradients: the output is gathered (and its gradient sliced back) on every rank of a CP group, so each rank's
backward yields its own slice's share of the group's gradient, and the group's gradient is their *sum*
(:attr:`rlrunner.cluster.parallelize.Engine.gradient_scale`: the loss times ``cp``, so that DDP's and FSDP2's mean
over all ``dp·cp`` ranks is the mean over the ``dp`` groups of that sum).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

CP_MODES = ("ulysses", "ring")
#: diffusers attention backends whose forward returns the log-sum-exp ring attention needs (``native``, the default
#: SDPA backend, does not)
RING_BACKENDS = ("flash", "flash_hub", "flash_varlen", "_flash_3", "_flash_3_hub", "_native_cudnn", "sage",
                 "_native_flash")
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
    (from :func:`parallel_mesh`), as ``ModelMixin.enable_parallelism`` would on a mesh of its own. Call before
    ``fully_shard`` (FSDP2) on the same module."""
    from diffusers.hooks.context_parallel import apply_context_parallel as register_hooks
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    if not has_cp_plan(type(module)):
        raise ValueError(f"{type(module).__name__} declares no _cp_plan: context parallelism needs a denoiser whose "
                         f"diffusers class has one")
    ring, ulysses = mesh["ring"].size(), mesh["ulysses"].size()
    config = ParallelConfig(context_parallel_config=ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses,
                                                                          mesh=mesh))
    rank = torch.distributed.get_rank()
    config.setup(rank, torch.distributed.get_world_size(), next(module.parameters()).device, mesh=mesh)
    for sub in module.modules():
        processor = getattr(sub, "processor", None) if isinstance(sub, (Attention, AttentionModuleMixin)) else None
        if processor is not None and hasattr(processor, "_parallel_config"):
            backend = getattr(processor, "_attention_backend", None)
            if ring > 1 and str(getattr(backend, "value", backend) or "native") not in RING_BACKENDS:
                raise ValueError(f"ring attention needs an attention backend that returns the log-sum-exp "
                                 f"({', '.join(RING_BACKENDS)}); {type(module).__name__} uses "
                                 f"{backend or 'native'}: use context_parallel_mode=ulysses")
            processor._parallel_config = config
    module._parallel_config = config
    register_hooks(module, config.context_parallel_config, module._cp_plan)


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


def attention_backend() -> str:
    """The attention backend diffusers' processors use unless set per model (``DIFFUSERS_ATTN_BACKEND``)."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    backend, _ = _AttentionBackendRegistry.get_active_backend()
    return str(getattr(backend, "value", backend))

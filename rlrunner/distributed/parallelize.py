"""The actor's data-parallel engine, in one place: torch's DDP or FSDP2 applied to a FlowModel. No Ray here.

``parallelize(model, strategy, world_size)`` returns the :class:`Engine` the actor trains through:

- ``ddp``: :class:`torch.nn.parallel.DistributedDataParallel` over the denoiser. Every rank holds the whole
  model; only parameters with ``requires_grad`` (the ``default`` LoRA adapter) are all-reduced, averaged over
  ranks, after the last backward of an optimizer step (``no_sync`` over the gradient accumulation passes).
- ``fsdp2``: :func:`torch.distributed.fsdp.fully_shard` on each transformer block (the classes the diffusers
  model lists in ``_no_split_modules``), then on the root. Base weights and both LoRA adapters are sharded
  over the ranks (DTensors, dim 0); a block's weights are gathered for its forward and backward only. Gradients
  (LoRA only; the base is frozen) are reduce-scattered in float32.

With one rank nothing is wrapped: the engine calls the model directly (the single-process path), unless the actor
formed a process group of one (``actor.one_rank_group``): then the strategy's engine runs over a one-rank mesh, so
FSDP2's DTensors and collectives are exercised on one device.

With ``actor.context_parallel_size`` ``cp > 1`` the ranks form a ``dp × cp`` mesh
(:mod:`rlrunner.distributed.context_parallel`): the CP hooks go on the denoiser first, then DDP (over all ranks) or
FSDP2 (sharding over all ranks of the same mesh) wraps it. The ``cp`` ranks of a group train the same samples,
each backward giving its sequence slice's share of their gradient, so the engine scales the loss by ``cp``
(:attr:`Engine.gradient_scale`): the engines' mean over ``dp·cp`` ranks is then the mean over the ``dp`` groups.

The model files know nothing of this: the DDP wrapper is a thin module that calls ``model.velocity``, and FSDP2
hooks the denoiser's own modules in place. Every rank must make the same engine calls in the same order
(forwards, backwards, :meth:`Engine.clip_grad_norm`, and gathering full tensors for checkpoints and weight sync).

Which samples each rank trains on, and in what order, is the contract of :mod:`rlrunner.step.sample_order`
(:func:`~rlrunner.step.sample_order.optimizer_step_shards`: optimizer step ``k`` always covers positions
``[k·G, (k+1)·G)`` of the shuffled batch, ``G = global_batch_size``, whatever the number of ranks).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from rlrunner.distributed.context_parallel import flat_mesh, parallel_mesh


class Engine:
    """One rank's view of data-parallel training; this base class is the single-process engine (no wrapping).

    ``velocity`` gives ``v_θ`` (trained adapter, with gradients) through the engine's hooks;
    ``accumulate(sync)`` wraps one forward + backward of a gradient-accumulation sequence (``sync=False`` keeps
    the gradients local; the last pass of an optimizer step must sync); ``clip_grad_norm`` clips the reduced
    gradients in place and returns their total norm (the same number on every rank).
    """

    def __init__(self, model: Any, context_parallel_size: int = 1) -> None:
        self.model = model
        #: multiplies each rank's loss before backward: ``cp``, since a CP group's gradient is the sum of its ranks'
        #: (each backward covers one slice of the sequence) and the engines average over every rank
        self.gradient_scale = context_parallel_size

    def velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        """``v_θ(x_t, t)``: latents ``[B, *latent_shape]``, t ``[B]`` -> ``[B, *latent_shape]``."""
        return self.model.velocity(latents, t, cond)

    @contextlib.contextmanager
    def accumulate(self, sync: bool) -> Iterator[None]:
        yield

    def clip_grad_norm(self, params: list[nn.Parameter], max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


class _TrainedVelocity(nn.Module):
    """``model.velocity`` as a module, so DDP's forward (which arms its gradient hooks) wraps the model call."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.transformer = model.transformer  # registers the denoiser's parameters with DDP
        self.flow_model = model

    def forward(self, latents: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.flow_model.velocity(latents, t, cond)


class DDPEngine(Engine):
    def __init__(self, model: Any, mesh: Any, context_parallel_size: int) -> None:
        super().__init__(model, context_parallel_size)
        # buffers are identical on every rank (same files, same seeded LoRA init): no per-forward broadcast. Every
        # LoRA tensor gets a gradient in every backward (a family leaves no adapter where the model discards the
        # output, and an idle expert gets a zero one: tests/models/test_family_parallel.py), so no unused-parameter
        # search per step
        self.ddp = nn.parallel.DistributedDataParallel(_TrainedVelocity(model), **_no_forward_buffer_sync())

    def velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.ddp(latents, t, cond)

    @contextlib.contextmanager
    def accumulate(self, sync: bool) -> Iterator[None]:
        with contextlib.nullcontext() if sync else self.ddp.no_sync():
            yield


class FSDP2Engine(Engine):
    def __init__(self, model: Any, mesh: Any, context_parallel_size: int) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        super().__init__(model, context_parallel_size)
        mesh = flat_mesh(mesh)  # every rank, CP groups included, holds a shard
        # the base weights are already stored in actor.model.precision and the LoRA tensors in float32 (see
        # models/base.py), so each is gathered and computed in its own dtype; gradients are reduced in float32
        policy = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)
        # a denoiser still in host memory (build_model's denoiser_on_host) reaches the device one block at a time:
        # fully_shard moves the module's own parameters to the mesh's device, shards them and frees the full ones
        for block in transformer_blocks(model.transformer):
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model.transformer, mesh=mesh, mp_policy=policy)
        _gather_once(model.transformer)
        model.empty_device_cache()  # the freed full blocks, cached by the allocator, go back to the device

    @contextlib.contextmanager
    def accumulate(self, sync: bool) -> Iterator[None]:
        """As :meth:`Engine.accumulate`; after the sync pass a trained parameter that no micro-batch of the step
        reached on any rank (an expert without rows, which FSDP2 then never gathers: :mod:`rlrunner.models.wan_a14b`)
        gets a zero gradient, the one it gets on one device, so AdamW steps it as it does there."""
        self.model.transformer.set_requires_gradient_sync(sync)
        yield
        if sync:
            for param in self.model.trainable_parameters():
                if param.grad is None:
                    param.grad = torch.zeros_like(param)

    def clip_grad_norm(self, params: list[nn.Parameter], max_norm: float) -> float:
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in params if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if isinstance(total, DTensor):  # per-shard norms: reduce them to the norm of the whole gradient
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return float(total)


ENGINES: dict[str, type[Engine]] = {"ddp": DDPEngine, "fsdp2": FSDP2Engine}


def _no_forward_buffer_sync() -> dict[str, bool]:
    """The keyword that stops the installed torch's DDP from broadcasting buffers before every forward:
    ``forward_sync_buffers=False`` where DDP has it (torch 2.13 added it and deprecates the other with a
    FutureWarning), else ``broadcast_buffers=False`` (older torch, 2.11 among them), which also skips the buffers'
    broadcast when DDP is built; either way the parameters are broadcast from rank 0 then, and the buffers are the
    same on every rank already (tests/distributed/test_ddp_versions.py)."""
    accepted = inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in accepted else {"broadcast_buffers": False}


def _gather_once(transformer: nn.Module) -> None:
    """All-gather and free each FSDP2 module's weights once, one module at a time: a module that no rank runs in a
    gradient-accumulation pass (an idle expert, :mod:`rlrunner.models.wan_a14b`) then has the unsharded state that
    FSDP2's post-backward of that pass reads (torch 2.13 raises ``'FSDPParam' object has no attribute
    '_unsharded_param'`` for a module never gathered)."""
    from torch.distributed.fsdp import FSDPModule

    for module in transformer.modules():
        if isinstance(module, FSDPModule):
            module.unshard()
            module.reshard()


def transformer_blocks(transformer: nn.Module) -> list[nn.Module]:
    """The denoiser's blocks (classes named in diffusers' ``_no_split_modules``), innermost first."""
    names = set(getattr(transformer, "_no_split_modules", None) or ())
    blocks = [m for m in transformer.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"actor.strategy=fsdp2 shards the denoiser per block, but {type(transformer).__name__} "
                         f"names no block classes in _no_split_modules ({sorted(names)}); use actor.strategy=ddp")
    return blocks[::-1]  # modules() lists parents before children; fully_shard wants children first


def parallelize(model: Any, strategy: str, world_size: int, context_parallel_size: int = 1,
                context_parallel_mode: str = "ulysses", *, one_rank_group: bool = False) -> Engine:
    """Apply ``strategy`` (``ddp`` | ``fsdp2``) to ``model`` (a FlowModel) over the default process group, its
    ranks in CP groups of ``context_parallel_size`` (``ulysses`` | ``ring``, :mod:`~rlrunner.distributed.context_parallel`).

    Call after ``init_distributed`` and before building the optimizer: FSDP2 replaces the parameters by their
    shards, so the optimizer must be given ``model.trainable_parameters()`` afterwards. With one rank the model is
    wrapped only when ``one_rank_group`` (a process group of one was formed, ``init_distributed(one_rank_group=True)``).

    FSDP2 takes a denoiser still in host memory to the device one block at a time, keeping each rank's shards there
    (the actor builds it so where :func:`shards_from_host` says).
    """
    if strategy not in ENGINES:
        raise ValueError(f"actor.strategy={strategy!r} is not valid; choose one of {list(ENGINES)}")
    if not _wraps(world_size, one_rank_group):
        return Engine(model)
    mesh = parallel_mesh(model.device.type, world_size, context_parallel_size, context_parallel_mode)
    if context_parallel_size > 1:
        model.enable_context_parallel(mesh)  # hooks first, on the modules FSDP2 then shards
    return ENGINES[strategy](model, mesh, context_parallel_size)


def shards_from_host(strategy: str, world_size: int, one_rank_group: bool) -> bool:
    """Whether :func:`parallelize` applies FSDP2 (``strategy`` over ``world_size`` ranks, ``actor.one_rank_group``):
    then the denoiser is built in host memory (``build_model(denoiser_on_host=True)``) and reaches the device shard
    by shard, never whole."""
    return strategy == "fsdp2" and _wraps(world_size, one_rank_group)


def _wraps(world_size: int, one_rank_group: bool) -> bool:
    """Whether :func:`parallelize` wraps the model: several ranks, or a process group of one."""
    return world_size > 1 or one_rank_group


def local_shards(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """This rank's part of each tensor (a view of a sharded DTensor's shard, else the tensor): elementwise
    in-place updates of matching shards, such as the EMA of one adapter towards the other, need no collective."""
    from torch.distributed.tensor import DTensor

    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]

"""The recipe's step run at full size on fake tensors: what each component holds on its device, phase by phase.

``bin/rlrunner plan <recipe> --simulate`` calls :func:`simulate_recipe`. Each component is simulated as one rank
of its group (rank 0; the others mirror it):

* **rollout**: the recipe's model (denoiser with both LoRA adapters, text encoders, VAE) built from the folder's
  config files (:mod:`rlrunner.sizing.fake_build`); phases ``rollout_load``, ``rollout`` (the objective's own
  rollout: the sampler's passes with the recipe's guidance, for one ``generate`` call's samples) and ``decode``
  (the family's VAE decode of them).
* **actor**: the real :class:`~rlrunner.workers.actor.ActorWorker`, its model built the same way, under the recipe's
  strategy over its actor world size on torch's fake process group; phases ``actor_load`` (model, engine,
  AdamW), ``update`` (its ``update`` on this rank's share of the step: micro-batches, the objective's loss, the
  engine's gradient sync, AdamW), ``ema`` and ``weight_sync`` (``lora_weights``).

Bytes and FLOPs are counted by :class:`~rlrunner.sizing.tracker.MemoryTracker` (FLOPs by the formulas of torch's flop
counter: its ``FlopCounterMode`` itself keeps tensors alive through its module hooks). What is not simulated is
named in :attr:`Simulation.not_simulated`, never dropped silently.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from omegaconf import OmegaConf
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

from rlrunner.distributed.context_parallel import parallel_mesh
from rlrunner.sizing.fake_build import build_fake_model, fake_process_group, outside_fake
from rlrunner.sizing.memory import env_plan
from rlrunner.sizing.tracker import MemoryTracker, PhasePeak
from rlrunner.utils.device import PRECISIONS

#: what no recipe's simulation runs (named on screen and in the JSON)
NOT_SIMULATED = (
    ("weight_sync: the gathered adapter's copies that a device moves to host memory (.cpu()) count on the device, "
     "where the simulation runs (an upper bound of that phase: up to 4 x one adapter)"),
    "eval rollouts: the rollout phase with the eval sampler's steps and the trained adapter; not run separately",
    ("env: the reward models are not run; their weights count at the sizes the plan gives them "
     "(Reward.device_memory), OCR engines not at all"),
    "the CUDA context (~0.5-1 GiB per process) and allocator fragmentation",
)
#: micro-batches of the one optimizer step the actor simulation runs: two without gradient sync, then the sync pass
SIMULATED_MICRO_BATCHES = 3


@dataclass
class ComponentRun:
    """One simulated component: its phase peaks in order, the bytes it keeps between phases, FLOPs per phase."""

    name: str
    phases: dict[str, PhasePeak] = field(default_factory=dict)
    resident: int = 0  # bytes it holds on its device between its phases
    swappable: int = 0  # of those, what ``cluster.enable_offload`` moves to host memory while another runs
    flops: dict[str, int] = field(default_factory=dict)
    not_simulated: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Simulation:
    """Every simulated component of a recipe, and what was left out."""

    components: dict[str, ComponentRun]
    not_simulated: list[str]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


def _cond(shapes: Any, rows: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``rows`` rows of the family's text conditioning (:class:`~rlrunner.models.shapes.SampleShapes`)."""
    return {name: _zeros((rows, *shape), dtype if kind is None else kind)
            for name, (shape, kind) in shapes.cond.items()}


def _storage_bytes(module: torch.nn.Module) -> int:
    seen: dict[int, int] = {}
    for tensor in (*module.parameters(), *module.buffers()):
        local = getattr(tensor, "_local_tensor", tensor)
        seen[id(local.untyped_storage())] = local.untyped_storage().nbytes()
    return sum(seen.values())


@contextlib.contextmanager
def _measured(run: ComponentRun, tracker: MemoryTracker, phase: str, category: str = "activations") -> Iterator[None]:
    """The block as ``phase`` of ``run``: its peak bytes and FLOPs."""
    flops = tracker.flops
    with tracker.in_phase(phase, category):
        yield
    run.phases[phase] = tracker.phases[phase]
    run.flops[phase] = tracker.flops - flops


def _modes(fake: bool) -> tuple[FakeTensorMode | None, MemoryTracker]:
    """The fake mode and tracker of a simulation; ``fake=False``: real tensors, counted alike (the tests' check)."""
    if fake:
        return FakeTensorMode(allow_non_fake_inputs=True), MemoryTracker()
    return None, MemoryTracker(count_real=True)


def simulate_rollout(cfg: Any, geometry: Any, fake: bool = True) -> tuple[ComponentRun, dict]:
    """The rollout worker's phases for one ``generate`` call; also the per-sample training tensors it returns
    (name -> (shape, dtype)), which the actor trains on."""
    from rlrunner.objectives import build_objective

    started = time.perf_counter()
    run = ComponentRun("rollout")
    model_cfg = cfg.actor.model
    family_cfg = model_cfg[model_cfg.model_type]
    dtype = PRECISIONS[str(model_cfg.precision)]
    fake_mode, tracker = _modes(fake)
    samples = geometry.samples_per_rollout_call
    cp = geometry.rollout_cp
    # a context-parallel group: rank 0 of ``cp`` fake ranks, its sequence split by the model's own CP hooks
    with fake_process_group(cp), _constant_digest(), _expert_routing(), fake_mode or contextlib.nullcontext(), \
            tracker:
        with _measured(run, tracker, "rollout_load", "parameters"), unset_fake_temporarily():
            model = build_fake_model(model_cfg, fake_mode, tracker, denoiser_only=False, dtype=dtype)
        objective = build_objective(cfg.algorithm, family_cfg, model.resolved_guidance)
        if cp > 1:
            model.enable_context_parallel(outside_fake(parallel_mesh)("cpu", cp, cp, "ulysses"))
        run.swappable = _storage_bytes(model.transformer)
        run.not_simulated.append("rollout: text encoders' forward (no prompts are tokenized; their weights count)")
        cond = model.repeat_cond(_cond(model.shapes, geometry.prompts_per_rollout_call or 1, dtype), geometry.group_size)
        if model.guidance == "cfg" and model.resolved_guidance.scale > 1:
            model._negative_cond = _cond(model.shapes, 1, dtype)  # the negative prompt's conditioning, encoded
        noise = _zeros((samples, *model.latent_shape), torch.float32)
        with _measured(run, tracker, "rollout"):
            x0, kept = objective.rollout(model, cond, noise, torch.Generator())
        with _measured(run, tracker, "decode"):
            try:
                model.decode(x0)
            except RuntimeError as err:  # the uint8 pixels go to numpy, which a fake tensor cannot: decode is over
                if "numpy" not in str(err).lower() and "fake" not in str(err).lower():
                    raise
        del x0, kept
        run.resident = tracker.current  # parts kept in host memory between uses (offload_vae, ...) not counted
    train = {"x0": (tuple(model.latent_shape), torch.float32)}
    train.update({name: (tuple(t.shape[1:]), t.dtype) for name, t in _kept_shapes(objective, model, cond, noise, fake)})
    run.seconds = time.perf_counter() - started
    return run, train


def _kept_shapes(objective: Any, model: Any, cond: dict[str, torch.Tensor], noise: torch.Tensor, fake: bool) -> list:
    """The tensors the objective's rollout keeps per sample (shapes only), from a rollout of one sample."""
    if not objective.kept_latents_per_sample():
        return []
    fake_mode, tracker = _modes(fake)
    with _expert_routing(), fake_mode or contextlib.nullcontext(), tracker:
        _, kept = objective.rollout(model, {k: v[:1] for k, v in cond.items()}, noise[:1], torch.Generator())
    return list(kept.items())


def actor_samples(cfg: Any, geometry: Any) -> tuple[int, int]:
    """(samples this rank trains on in a step, samples the simulation trains it on): one optimizer step of at most
    :data:`SIMULATED_MICRO_BATCHES` micro-batches, which reaches the step's peak (gradients held, the sync pass,
    AdamW); the step's other micro-batches repeat it."""
    per_rank = geometry.samples_per_group
    return per_rank, min(per_rank, geometry.local_batch, SIMULATED_MICRO_BATCHES * geometry.micro_batch_size)


def _actor_batch(geometry: Any, model: Any, train: dict, dtype: torch.dtype, n: int) -> tuple:
    """``n`` samples of this rank's share of a step as the runner sends them: (rollout parts, index,
    sample_index, advantages)."""
    from rlrunner.step.batch import Batch

    prompts = max(1, n // geometry.group_size)
    tensors = {name: _zeros((n, *shape), kind) for name, (shape, kind) in train.items()}
    per_prompt = {f"cond.{k}": v for k, v in _cond(model.shapes, prompts, dtype).items()}
    with unset_fake_temporarily():  # the indices are real (the tracker runs ops on real tensors for real)
        prompt_index, index = torch.arange(n) * prompts // n, torch.arange(n)
    batch = Batch(tensors, {}, per_prompt, prompt_index)
    return [batch], index, index.clone(), _zeros((n,), torch.float32)


def simulate_actor(cfg: Any, geometry: Any, train: dict, fake: bool = True) -> ComponentRun:
    """Rank 0 of the actor group over ``geometry.actor_ranks`` fake ranks: load, one step's update, EMA, sync."""
    from rlrunner.distributed import parallelize as parallelize_module
    from rlrunner.workers import actor as actor_module

    started = time.perf_counter()
    run = ComponentRun("actor")
    per_rank, simulated = actor_samples(cfg, geometry)
    actor_cfg = OmegaConf.merge(cfg.actor, {"global_batch_size": simulated * geometry.actor_groups})
    dtype = PRECISIONS[str(actor_cfg.model.precision)]
    fake_mode, tracker = _modes(fake)

    def build(model_cfg: Any, denoiser_only: bool = False, denoiser_on_host: bool = False) -> Any:
        with unset_fake_temporarily():
            return build_fake_model(model_cfg, fake_mode, tracker, denoiser_only=denoiser_only, dtype=dtype,
                                    denoiser_on_host=denoiser_on_host)

    world = geometry.actor_ranks
    if str(actor_cfg.strategy) == "ddp" and geometry.actor_cp == 1 and (world > 1 or actor_cfg.one_rank_group):
        # DDP's reducer cannot complete its all-reduce of fake tensors, on the fake backend nor over a real group of
        # one rank (actor.one_rank_group); a DDP rank holds what one device does
        ranks = f"{world} ranks" if world > 1 else "a one-rank group (actor.one_rank_group)"
        world = 1
        actor_cfg = OmegaConf.merge(actor_cfg, {"one_rank_group": False})
        run.not_simulated.append(f"actor.strategy=ddp over {ranks}: simulated as one rank "
                                 f"(DDP's gradient buckets, about the trained adapter's gradients, not counted)")
    with contextlib.ExitStack() as stack:
        stack.enter_context(fake_process_group(world))
        stack.enter_context(_constant_digest())
        stack.enter_context(_expert_routing())
        stack.enter_context(mock.patch.object(actor_module, "build_model", build))
        stack.enter_context(mock.patch.object(parallelize_module, "parallel_mesh",
                                              outside_fake(parallelize_module.parallel_mesh)))
        for patch in (*_fsdp_storage_patches(tracker), _sharded_from_host(tracker), *_ddp_start_patches()):
            stack.enter_context(patch)
        stack.enter_context(fake_mode or contextlib.nullcontext())
        stack.enter_context(tracker)
        with _measured(run, tracker, "actor_load", "parameters"):
            worker = actor_module.ActorWorker(actor_cfg, cfg.algorithm, 1, rank=0, world_size=world)
        _label_gradients(worker, tracker)
        rollout, index, sample_index, advantages = _actor_batch(geometry, worker.model, train, dtype, simulated)
        with _measured(run, tracker, "update"):
            worker.update(rollout, index, sample_index, advantages, 0)
        del rollout, index, sample_index, advantages
        with _measured(run, tracker, "ema"):
            worker.ema_update(0)
        with _measured(run, tracker, "weight_sync"):
            weights = worker.lora_weights()
        del weights
        run.resident = tracker.current
        run.swappable = run.resident  # the denoiser, both adapters and AdamW's state go to host memory
    run.flops["update"] = run.flops["update"] * per_rank // simulated  # the step's micro-batches repeat the simulated
    run.seconds = time.perf_counter() - started
    return run


def _ddp_start_patches() -> list:
    """DDP's start-up check of the ranks' parameter shapes and broadcast of rank 0's weights skipped: both read the
    tensors' bytes in C++, which fake tensors lack; every rank builds the same weights anyway."""
    from torch.nn.parallel import distributed as ddp_module

    def skip(*_: Any, **__: Any) -> None:
        return None

    return [mock.patch.object(ddp_module, "_verify_param_shape_across_processes", skip),
            mock.patch.object(ddp_module, "_sync_module_states", skip)]


@contextlib.contextmanager
def _expert_routing() -> Iterator[None]:
    """Two-expert denoisers (Wan2.2-A14B's :class:`~rlrunner.models.wan_a14b.SigmaExperts`): every row of a call
    goes to the high-noise expert, and the low-noise one runs its dummy wherever the real code runs it when another
    rank has rows for it (fake timesteps have no values to route by). Rows split between the experts hold the same
    activations in sum, and FSDP2 gathers both experts' blocks, as in a real micro-batch."""
    from rlrunner.models import wan_a14b

    def rows(self: Any, timestep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with unset_fake_temporarily():
            high = torch.ones(timestep.shape[0], dtype=torch.bool)
        return high, ~high

    def anywhere(self: Any, masks: tuple[torch.Tensor, ...]) -> list[bool]:
        return [True] * len(masks)

    with mock.patch.object(wan_a14b.SigmaExperts, "expert_rows", rows), \
            mock.patch.object(wan_a14b.SigmaExperts, "_rows_on_any_rank", anywhere):
        yield


def _constant_digest() -> Any:
    """The objectives' adapter digests (a hash of the weights' bytes, which fake tensors lack) as one constant: the
    kept v_old is then always exact, the path a real step takes when the actor's EMA matches the rollout's."""
    from rlrunner.objectives import nft

    def digest(state: dict[str, torch.Tensor]) -> torch.Tensor:
        with unset_fake_temporarily():
            return torch.zeros(2, dtype=torch.int64)

    return mock.patch.object(nft, "lora_digest", digest)


def _sharded_from_host(tracker: MemoryTracker) -> Any:
    """FSDP2's ``fully_shard`` of a module whose parameters wait in host memory (``denoiser_on_host``): they count on
    the device while the call moves and shards them, as the real call does; the shards it leaves count from then on,
    the full tensors until they are freed."""
    from torch.distributed import fsdp

    real = fsdp.fully_shard

    def shard(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        tracker.move(module, to_host=False)
        return real(module, *args, **kwargs)

    return mock.patch.object(fsdp, "fully_shard", shard)


def _fsdp_storage_patches(tracker: MemoryTracker) -> list:
    """FSDP2's storage resizes of its gathered weights (``alloc_storage`` / ``free_storage``), told to ``tracker``."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    def told(resize: Any) -> Any:
        def run(tensor: torch.Tensor) -> None:
            resize(tensor)
            tracker.resized(tensor)

        return run

    return [mock.patch.object(_fsdp_param, "alloc_storage", told(_fsdp_param.alloc_storage)),
            mock.patch.object(_fsdp_param, "free_storage", told(_fsdp_param.free_storage)),
            mock.patch.object(_fsdp_param_group, "alloc_storage", told(_fsdp_param_group.alloc_storage))]


def _label_gradients(worker: Any, tracker: MemoryTracker) -> None:
    """Count each trained tensor's gradient as ``gradients`` once accumulated, and AdamW's allocations (its state
    and foreach temporaries) as ``optimizer state``."""
    for param in worker.params:
        param.register_post_accumulate_grad_hook(lambda p: tracker.relabel([p.grad], "gradients"))
    saved: list[str] = []

    def before(*_: Any) -> None:
        saved.append(tracker.category)
        tracker.relabel([p.grad for p in worker.params if p.grad is not None], "gradients")
        tracker.category = "optimizer state"

    def after(*_: Any) -> None:
        tracker.category = saved.pop()

    worker.optimizer.register_step_pre_hook(before)
    worker.optimizer.register_step_post_hook(after)


def simulate_recipe(cfg: Any, geometry: Any, components: tuple[str, ...] = ("rollout", "actor")) -> Simulation:
    """Simulate ``components`` of the recipe ``cfg`` (the launcher's merged config) on ``geometry``
    (:func:`rlrunner.sizing.memory.step_geometry`); the rollout runs first (the actor trains on what it returns)."""
    from rlrunner.models import schedules

    runs: dict[str, ComponentRun] = {}
    # the sampler's grid from the scheduler's real buffers (UniPC reads them through numpy): bookkeeping, no memory
    with mock.patch.object(schedules, "_fresh_schedule", outside_fake(schedules._fresh_schedule)):
        rollout, train = simulate_rollout(cfg, geometry)
        if "rollout" in components:
            runs["rollout"] = rollout
        if "actor" in components:
            runs["actor"] = simulate_actor(cfg, geometry, train)
    runs["env"] = ComponentRun("env", resident=env_plan(cfg.env).resident_bytes)  # held on its devices throughout
    not_simulated = [line for run in runs.values() for line in run.not_simulated]
    not_simulated += list(NOT_SIMULATED)
    return Simulation(runs, not_simulated)

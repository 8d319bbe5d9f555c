"""Actor worker: the update of the ``default`` LoRA adapter (the loss of ``algorithm.name``) and the EMA of the
``ema`` adapter."""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch

from rlrunner.algorithms.ema import decay_at, ema_update_, tau_at
from rlrunner.config.paths import node_paths
from rlrunner.distributed.parallelize import local_shards, parallelize, shards_from_host
from rlrunner.models import ADAPTERS, EMA_ADAPTER, TRAINED_ADAPTER, build_model
from rlrunner.objectives import MicroBatch, build_objective
from rlrunner.step.batch import Batch
from rlrunner.step.sample_order import level_seed, noise_seed
from rlrunner.step.sizes import data_parallel_groups, optimizer_step_share
from rlrunner.utils.flat_state import FlatState, gather_flat, unpack_flat
from rlrunner.utils.seeding import derive_seed, rng_state, set_rng_state


def _cond(batch: Batch, device: torch.device) -> dict[str, torch.Tensor]:
    """The conditioning of ``batch``'s samples, ``[B, ...]``: its prompts' rows sent to ``device``, expanded there."""
    return {k.removeprefix("cond."): v for k, v in batch.per_sample(device).items() if k.startswith("cond.")}


class ActorWorker:
    """One data-parallel rank of the trainer.

    ``update`` runs ``samples / global_batch_size`` optimizer steps over this rank's share of a rollout batch,
    in micro-batches with gradient accumulation, through torch's DDP or FSDP2 (``actor.strategy``, see
    :mod:`rlrunner.distributed.parallelize`), which average the gradients over ranks. Each sample's training noise
    is seeded by its global index in the step's batch, so the result does not depend on the number of ranks.
    With ``actor.context_parallel_size`` ``cp > 1``, ``cp`` consecutive ranks form a group that trains the same
    samples, each rank one slice of every sample's token sequence (:mod:`rlrunner.distributed.context_parallel`).
    Methods that gather full tensors (``ema_update`` aside, everything that returns adapters or optimizer state)
    must be called on every rank; rank 0 returns the result. The actor writes no files: the driver writes the
    checkpoint (adapters in diffusers' format included) from what :meth:`state_dict` returns.
    """

    forms_process_group = True  # its ranks average gradients: the cluster sets up their rendezvous

    @staticmethod
    def node_paths(actor_cfg: Any, *args: Any, **kwargs: Any) -> dict[str, str]:
        """The local paths this worker reads (checked on its node before it starts; rlrunner.config.paths)."""
        return node_paths("actor", actor_cfg, "actor")

    def __init__(self, actor_cfg: Any, algorithm_cfg: Any, num_train_steps: int, *, rank: int = 0,
                 world_size: int = 1) -> None:
        from rlrunner.distributed.process_group import init_distributed

        self.cfg, self.alg = actor_cfg, algorithm_cfg
        self.rank, self.world_size = rank, world_size
        self.data_parallel_size = data_parallel_groups(world_size, actor_cfg.context_parallel_size)
        self.family_cfg = actor_cfg.model[actor_cfg.model.model_type]
        torch.manual_seed(derive_seed(actor_cfg.seed, "actor-init", 0, 0))  # identical LoRA init on every rank
        # the actor trains on latents with the rollout's conditioning: it never encodes prompts nor decodes, so it
        # loads neither text encoders nor VAE (not even into host memory); under FSDP2 the denoiser stays in host
        # memory until parallelize moves it to the device shard by shard (it never holds it whole)
        shards = shards_from_host(actor_cfg.strategy, world_size, actor_cfg.one_rank_group)
        self.model = build_model(actor_cfg.model, denoiser_only=True, denoiser_on_host=shards)
        self.objective = build_objective(algorithm_cfg, self.family_cfg, self.model.resolved_guidance)
        grouped = init_distributed(rank, world_size, self.model.device.type, one_rank_group=actor_cfg.one_rank_group)
        self.engine = parallelize(self.model, actor_cfg.strategy, world_size, actor_cfg.context_parallel_size,
                                  actor_cfg.context_parallel_mode, one_rank_group=grouped)
        self.params = self.model.trainable_parameters()  # after parallelize: FSDP2 swaps them for their shards
        optim = actor_cfg.optim
        self.optimizer = torch.optim.AdamW(self.params, lr=optim.lr, betas=(optim.adam_beta1, optim.adam_beta2),
                                           eps=optim.adam_eps, weight_decay=optim.weight_decay)
        from diffusers.optimization import get_scheduler

        self.lr_scheduler = get_scheduler(optim.lr_scheduler, self.optimizer, num_warmup_steps=optim.lr_warmup_steps,
                                          num_training_steps=max(1, num_train_steps))
        self.optimizer_steps = 0
        self.offloaded = False  # denoiser and optimizer state in host memory (cluster.enable_offload)

    # ------------------------------------------------------------------ training
    def update(self, rollout: list[Batch], index: torch.Tensor, sample_index: torch.Tensor, advantages: torch.Tensor,
               step: int) -> dict[str, float]:
        """Train on this rank's samples (see :mod:`rlrunner.step.sample_order`): rows ``index`` (int64 ``[n]``, in
        training order) of ``rollout``, this rank's training parts of the rollout shards joined in order (``x0``,
        per-prompt ``cond.*``), with their positions in the step's shuffled order ``sample_index`` ``[n]`` (seeds of
        their training noise) and ``advantages`` ``[n]`` or ``[n, K]``. The k-th ``global_batch_size / groups``
        samples belong to optimizer step k (the ranks of a context-parallel group receive the same samples)."""
        batch = Batch.cat(rollout).select(index)
        batch.tensors.update(advantages=advantages, sample_index=sample_index)
        self.objective.begin_update(self.model)
        local_batch = optimizer_step_share(self.cfg.global_batch_size, self.data_parallel_size)
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for opt_batch in batch.split(local_batch):
            for name, value in self._optimizer_step(opt_batch, step).items():
                sums[name] += value
                counts[name] += 1
        return {name: sums[name] / counts[name] for name in sums}

    def _optimizer_step(self, batch: Batch, step: int) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = defaultdict(float)
        draws = self.objective.draws()
        passes = [(micro, draw) for micro in batch.split(self.cfg.micro_batch_size) for draw in range(draws)]
        for index, (micro, draw) in enumerate(passes):
            # this rank's loss is the mean over its samples; the engine averages the ranks' gradients (equal
            # sample counts), reducing them once per optimizer step, after its last backward (gradient_scale:
            # a context-parallel group's gradient is the sum of its ranks')
            share = len(micro) / len(batch) / draws
            with self.engine.accumulate(sync=index == len(passes) - 1):
                levels = self._level_generators(micro, step) if draws > 1 else None  # one draw: its own level
                loss, micro_metrics = self._micro_loss(micro, self._noise_generators(micro, step, draw), draw, levels)
                (loss * (share * self.engine.gradient_scale)).backward()
            for name, value in micro_metrics.items():
                metrics[name] += value * share
        grad_norm = self.engine.clip_grad_norm(self.params, self.cfg.optim.clip_grad)
        # a NaN loss on any rank makes the reduced gradients, hence grad_norm, NaN on all: every rank skips
        finite = math.isfinite(grad_norm) and math.isfinite(metrics[self.objective.loss_key])
        if finite:
            self.optimizer.step()
            self.lr_scheduler.step()
            self.optimizer_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        metrics.update(grad_norm=grad_norm, lr=self.lr_scheduler.get_last_lr()[0], nonfinite=float(not finite))
        return metrics

    def _noise_generators(self, micro: Batch, step: int, draw: int) -> list[torch.Generator]:
        """One generator per sample, seeded by (seed, step, its position in the step, draw): never by rank."""
        return [torch.Generator().manual_seed(noise_seed(self.cfg.seed, step, position, draw))
                for position in micro.tensors["sample_index"].tolist()]

    def _level_generators(self, micro: Batch, step: int) -> list[torch.Generator]:
        """One generator per sample, seeded by (seed, step, its position in the step): the same in every draw."""
        return [torch.Generator().manual_seed(level_seed(self.cfg.seed, step, position))
                for position in micro.tensors["sample_index"].tolist()]

    def _micro_loss(self, micro: Batch, generators: list[torch.Generator], draw: int = 0,
                    level_generators: list[torch.Generator] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective's loss on one micro-batch pass (with gradient) and its metrics."""
        inputs = MicroBatch(dict(micro.tensors), _cond(micro, self.model.device), generators, draw,
                            level_generators or [])
        return self.objective.loss(self.model, self.engine, inputs)

    # ------------------------------------------------------------------ EMA and sync
    def tau(self, step: int) -> float:
        """tau of the EMA update after global step ``step``'s update: ``nft_tau`` at the global step, or the official
        code's ``nft_decay_type`` at the optimizer steps taken so far, this step's included (as its global_step)."""
        if self.alg.nft_decay_type:
            return 1.0 - decay_at(self.alg.nft_decay_type, self.optimizer_steps)
        spec = self.alg.nft_tau
        return tau_at(spec if isinstance(spec, (int, float)) else list(spec), step)

    def ema_update(self, step: int) -> float:
        """``ema ← (1 − tau)·ema + tau·θ`` on the LoRA tensors only; returns tau."""
        tau = self.tau(step)
        ema_update_(local_shards(self.model.adapter_parameters(EMA_ADAPTER)),
                    local_shards(self.model.adapter_parameters(TRAINED_ADAPTER)), tau)
        return tau

    def lora_weights(self, adapters: tuple[str, ...] = ADAPTERS,
                     flat: bool = False) -> dict[str, FlatState] | dict[str, dict[str, torch.Tensor]] | None:
        """The full LoRA tensors (CPU) of ``adapters`` (a weight sync asks only for those the rollout samples with),
        each adapter gathered as one flat buffer (:mod:`rlrunner.utils.flat_state`) and returned so with ``flat``,
        else unpacked into name -> tensor. Every rank must call it (FSDP2: one all-gather per adapter); rank 0
        returns them, the others None."""
        with self.on_device():
            weights = {name: gather_flat(self.model.adapter_named_parameters(name)) for name in adapters}
        if self.rank != 0:
            return None
        return weights if flat else {name: unpack_flat(packed) for name, packed in weights.items()}

    def offload(self) -> None:
        """Denoiser and optimizer state to host memory, freeing the device for a collocated rollout worker."""
        self._move(offload=True)

    def onload(self) -> None:
        self._move(offload=False)

    def _move(self, offload: bool) -> None:
        self.model.offload_transformer(offload)
        device = torch.device("cpu") if offload else self.model.device
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(device)
        self.offloaded = offload

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        """The denoiser and optimizer state on the device for the block, and back in host memory after it if they
        were offloaded.

        Everything that gathers (or loads) adapters or optimizer state runs in it, so that a host tensor never
        reaches a collective: the contract is :class:`rlrunner.step.device_turns.DeviceTurns`'s, whose ``actor_call``
        hands the actor the device first, so that there this is a no-op; it guards other callers.
        """
        offloaded = self.offloaded
        if offloaded:
            self.onload()
        try:
            yield
        finally:
            if offloaded:
                self.offload()

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any] | None:
        """The actor's state, independent of strategy and rank count: full adapters, optimizer state keyed by
        parameter name, LR scheduler, RNG. Every rank must call it; rank 0 returns it, the others None."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        with self.on_device():
            adapters = self.lora_weights()
            optimizer = get_optimizer_state_dict(self.model.transformer, self.optimizer,
                                                 options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        return {"adapters": adapters, "optimizer": optimizer, "lr_scheduler": self.lr_scheduler.state_dict(),
                "rng": rng_state(), "optimizer_steps": self.optimizer_steps, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a :meth:`state_dict` saved with any strategy and number of ranks (every rank gets the same one)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        with self.on_device():
            for name, lora in state["adapters"].items():
                self.model.load_lora_state_dict(name, lora)
            # strict=False: a LoRA tensor that never got a gradient has no AdamW state to save or to load (an expert
            # that no sample has reached yet)
            set_optimizer_state_dict(self.model.transformer, self.optimizer, state["optimizer"],
                                     options=StateDictOptions(full_state_dict=True, strict=False))
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        set_rng_state(state["rng"])
        self.optimizer_steps = state["optimizer_steps"]

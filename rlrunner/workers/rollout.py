"""Rollout worker: holds the model with the EMA ("old") adapter and samples groups of images or videos."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from rlrunner.config.paths import node_paths
from rlrunner.models import TRAINED_ADAPTER, build_model
from rlrunner.objectives import build_objective
from rlrunner.step.batch import Batch
from rlrunner.utils.flat_state import FlatState, is_flat, unpack_flat
from rlrunner.utils.seeding import derive_seed


class RolloutOutput(NamedTuple):
    """A rollout shard in the parts that go to different places (cut where it is computed and read by name:
    :class:`rlrunner.step.data_plane.RolloutParts`, so that the actor never receives pixels and the driver only what it
    logs).

    ``train``: tensor ``x0`` ``[N, *latent_shape]`` (float32), per-prompt conditioning ``cond.<name>``
    ``[P, ...]`` and ``prompt_index`` ``[N]``: what the actor trains on. ``scored``: tensor ``images`` uint8
    ``[N, H, W, 3]`` (or frames ``[N, F, H, W, 3]``) and meta ``prompts`` and ``rows`` (each sample's row in its
    prompt set, which names its metadata): what the env workers score.
    """

    train: Batch
    scored: Batch

    def train_rows(self, rows: list[int]) -> Batch:
        """The training part's samples ``rows`` (ascending): one actor rank's share (:meth:`TrainPlan.shard_rows
        <rlrunner.step.sample_order.TrainPlan.shard_rows>`), copied out, so that the rank fetches nothing else."""
        return self.train.select(rows)

    def first(self, n: int) -> Batch:
        """The first ``n`` scored samples, copied: a pickled view would carry every image of its storage."""
        return Batch({k: v[:n].clone() for k, v in self.scored.tensors.items()},
                     {k: v[:n] for k, v in self.scored.meta.items()})


class RolloutWorker:
    """Samples final clean latents ``x0`` as ``algorithm.name`` asks (:meth:`Objective.rollout`) and decodes them
    for the reward; evaluation samples the trained adapter with the eval sampler.

    Decoding happens here rather than in the env worker so that one copy of the VAE serves a device; the env
    worker receives uint8 pixels, which it needs anyway for OCR.

    With ``context_parallel_size`` ``k > 1`` (``rollout.context_parallel_size``), ``k`` consecutive ranks form a
    group that samples one shard together, each rank computing one slice of every denoiser call's token sequence
    (:mod:`rlrunner.distributed.context_parallel`); they draw the same noise (seeded by the group, not the rank), and
    the group's first rank decodes and returns the result, the others None.
    """

    @staticmethod
    def node_paths(model_cfg: Any, *args: Any, **kwargs: Any) -> dict[str, str]:
        """The local paths this worker reads (checked on its node before it starts; rlrunner.config.paths)."""
        return node_paths("rollout", model_cfg, "actor.model")

    @staticmethod
    def forms_process_group(*args: Any, context_parallel_size: int = 1, **kwargs: Any) -> bool:
        """Rollout ranks form a process group only to sample a sequence together (context parallelism)."""
        return context_parallel_size > 1

    def __init__(self, model_cfg: Any, seed: int, *, algorithm_cfg: Any = None, context_parallel_size: int = 1,
                 rank: int = 0, world_size: int = 1) -> None:
        """``algorithm_cfg``: the recipe's ``algorithm`` section (None: the schema's defaults, NFT)."""
        self.group, self.leads_group = rank // context_parallel_size, rank % context_parallel_size == 0
        torch.manual_seed(derive_seed(seed, "rollout-init", self.group, 0))
        self.model = build_model(model_cfg)
        if context_parallel_size > 1:
            from rlrunner.distributed.context_parallel import parallel_mesh
            from rlrunner.distributed.process_group import init_distributed

            init_distributed(rank, world_size, self.model.device.type)
            self.model.enable_context_parallel(
                parallel_mesh(self.model.device.type, world_size, context_parallel_size, "ulysses"))
        self.family_cfg = model_cfg[model_cfg.model_type]
        if algorithm_cfg is None:
            from omegaconf import OmegaConf

            from rlrunner.config.schema import AlgorithmConfig

            algorithm_cfg = OmegaConf.structured(AlgorithmConfig)
        self.objective = build_objective(algorithm_cfg, self.family_cfg, self.model.resolved_guidance)
        self.seed, self.rank = seed, rank

    @torch.no_grad()
    def generate(self, prompts: list[str], group_size: int, step: int, round_index: int, mode: str = "train",
                 rows: list[int] | None = None) -> RolloutOutput | None:
        """Sample ``group_size`` images for each of ``prompts`` (distinct groups, samples of a group contiguous);
        ``rows``: each prompt's row in its prompt set (default ``0 .. len(prompts) - 1``), passed on with its samples.

        Returns the parts of :class:`RolloutOutput` (``N = len(prompts) * group_size`` samples; None on a rank that
        does not lead its context-parallel group); the text conditioning is sent once per prompt. Noise is seeded
        from (seed, mode, rollout group, step, round_index), so any rollout can be replayed.
        """
        train = mode == "train"
        cfg = self.family_cfg
        cond = self.model.encode_prompts(prompts)  # text encoders run once per prompt
        n = len(prompts) * group_size
        generator = torch.Generator().manual_seed(derive_seed(self.seed, f"rollout-{mode}", self.group, step,
                                                              round_index))
        noise = torch.randn((n, *self.model.latent_shape), generator=generator).to(self.model.device)
        cond_per_sample = self.model.repeat_cond(cond, group_size)
        kept: dict[str, torch.Tensor] = {}
        if train:
            generator_on_device = torch.Generator(self.model.device).manual_seed(
                derive_seed(self.seed, "rollout-sde", self.group, step, round_index))
            x0, kept = self.objective.rollout(self.model, cond_per_sample, noise, generator_on_device)
        else:
            guidance = self.model.resolved_guidance
            x0 = self.model.sample(cond_per_sample, noise, sampler=cfg.eval_sampler, num_steps=cfg.eval_num_steps,
                                   guidance_scale=guidance.eval_scale, guidance_scale_2=guidance.eval_scale_2,
                                   adapter=TRAINED_ADAPTER)
        if not self.leads_group:
            return None
        images = torch.from_numpy(np.ascontiguousarray(self.model.decode(x0)))
        prompt_index = torch.arange(len(prompts)).repeat_interleave(group_size)
        rows = range(len(prompts)) if rows is None else rows
        return RolloutOutput(
            train=Batch({"x0": x0.float().cpu(), **{k: v.cpu() for k, v in kept.items()}}, {},
                        {f"cond.{k}": v.cpu() for k, v in cond.items()}, prompt_index),
            scored=Batch({"images": images}, {"prompts": [p for p in prompts for _ in range(group_size)],
                                              "rows": [r for r in rows for _ in range(group_size)]}),
        )

    def offload(self) -> None:
        """Free the device for a collocated actor (``cluster.enable_offload``)."""
        self.model.offload_transformer(True)

    def onload(self) -> None:
        self.model.offload_transformer(False)

    def sync_weights(self, adapters: dict[str, FlatState | dict[str, torch.Tensor]]) -> None:
        """Load the LoRA tensors (only adapters, never base weights) the actor sent: per adapter one flat buffer
        (:func:`rlrunner.utils.flat_state.gather_flat`), unpacked by name and shape, or a name -> tensor dict (a
        checkpoint written before the flat sync). Adapters not sent keep what they hold."""
        for name, state in adapters.items():
            self.model.load_lora_state_dict(name, unpack_flat(state) if is_flat(state) else state)

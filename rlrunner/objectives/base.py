"""The interface between an algorithm and the workers (see the package docstring)."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from rlrunner.distributed.parallelize import Engine
from rlrunner.models import FlowModel
from rlrunner.models.guidance import Guidance

Tensor = torch.Tensor


@dataclass
class MicroBatch:
    """One micro-batch of one loss pass.

    ``tensors``, in host memory (move what you use to ``model.device``): every per-sample tensor of the rollout's
    training part, ``[B, ...]``: ``x0`` (float32 clean latents), what :meth:`Objective.rollout` kept,
    ``advantages`` (``[B]``, or ``[B, F]`` per latent frame) and ``sample_index`` (positions in the step's shuffled
    batch). ``cond``: the text conditioning ``[B, ...]``, on the device.
    ``generators``: one per sample, seeded by (step, sample position, ``draw``), never by rank: draw any training
    noise from them so that results do not depend on the number of actor ranks. ``draw``: which of the
    :meth:`Objective.draws` passes over these samples this is. ``level_generators``: one per sample, seeded by
    (step, sample position) but not ``draw``, so every draw reads the same stream: for choices the draws share
    (NFT's distinct noise levels); empty where the caller has no step (tests of one pass).
    """

    tensors: dict[str, Tensor]
    cond: dict[str, Tensor]
    generators: list[torch.Generator]
    draw: int
    level_generators: list[torch.Generator] = field(default_factory=list)

    @property
    def x0(self) -> Tensor:
        return self.tensors["x0"]

    @property
    def advantages(self) -> Tensor:
        return self.tensors["advantages"]


class Objective(abc.ABC):
    """What one ``algorithm.name`` asks of the rollout and the actor; the math itself is in ``rlrunner.algorithms``."""

    #: the metric (of :meth:`loss`) whose non-finite value makes every rank skip the optimizer step
    loss_key: ClassVar[str]
    #: the adapter the training rollout samples with (``ema`` for NFT's old policy, ``default`` on-policy)
    sampling_adapter: ClassVar[str]

    def __init__(self, algorithm_cfg: Any, family_cfg: Any, guidance: Guidance) -> None:
        self.alg, self.family, self.guidance = algorithm_cfg, family_cfg, guidance

    def rollout(self, model: FlowModel, cond: dict[str, Tensor], noise: Tensor,
                generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """The training rollout from ``noise`` ``[N, ...]`` (σ = 1) with conditioning ``cond`` ``[N, ...]``.

        ``generator`` (on noise's device) seeds any noise the integration draws. Returns x0 ``[N, ...]`` and the
        per-sample tensors ``[N, ...]`` that :meth:`loss` reads besides x0. This default: the recipe's ODE sampler
        with :attr:`sampling_adapter`, nothing more.
        """
        return self.sample(model, cond, noise), {}

    def sample(self, model: FlowModel, cond: dict[str, Tensor], noise: Tensor, **kwargs: Any) -> Tensor:
        """:meth:`FlowModel.sample` with the recipe's training sampler and steps, the model's resolved guidance
        (``model.resolved_guidance``) and :attr:`sampling_adapter`."""
        family, guidance = self.family, model.resolved_guidance
        return model.sample(cond, noise, sampler=family.train_sampler, num_steps=family.num_steps,
                            guidance_scale=guidance.scale, guidance_scale_2=guidance.scale_2,
                            adapter=self.sampling_adapter, **kwargs)

    def begin_update(self, model: FlowModel) -> None:
        """Called on every actor rank at the start of each update, before its loss passes (the adapters change
        only after them: optimizer steps move ``default``, the EMA update follows the update). This default: nothing."""

    def kept_latents_per_sample(self) -> int:
        """How many latent-sized float32 tensors :meth:`rollout` keeps per sample besides x0 (memory plans)."""
        return 0

    def draws(self) -> int:
        """Loss passes over each sample per optimizer step (each with its own :class:`MicroBatch` ``draw``)."""
        return 1

    @abc.abstractmethod
    def loss(self, model: FlowModel, engine: Engine, micro: MicroBatch) -> tuple[Tensor, dict[str, float]]:
        """The loss of one micro-batch pass (a scalar with gradient, mean over its samples) and its metrics.

        ``engine.velocity(x, t, cond)`` gives ``v_θ`` with gradients (trained adapter, through DDP/FSDP2);
        ``model.velocity(..., adapter=...)`` under ``torch.no_grad()`` gives the other adapters' velocities.
        """

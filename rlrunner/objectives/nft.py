"""DiffusionNFT (``algorithm.name: nft``): rollouts from the EMA ("old") policy, the loss of
:func:`rlrunner.algorithms.nft_loss.nft_loss` at noisy states of the rollout's samples.

Where the training state ``(x_t, t)`` comes from (``algorithm.nft_xcur_source``):

- ``resample`` (RLinf's diffusion recipes, NVlabs' trainer): fresh noise on the rollout's final x0,
  ``x_t = (1 - t)·x0 + t·ε`` with t drawn from ``algorithm.nft_train_timesteps``'s grid (:func:`training_grid`);
  ``v_old`` is one no-grad forward of the EMA adapter. With ``nft_timesteps_per_sample`` K > 1 a sample's K draws
  take K distinct levels of the grid (t = 1 included), as NVlabs' per-sample permutation of its timesteps: draw j
  takes entry j of :func:`distinct_levels` seeded by (seed, step, sample position), never by rank; K = 1 draws
  the level from the draw's own noise generator, as before.
- ``rollout`` (RLinf's default for embodied NFT): the rollout's own states. Each sample keeps
  ``nft_timesteps_per_sample`` distinct steps i of its trajectory (drawn with the rollout's generator): the state
  ``x_i`` at ``t = σ_i`` and the velocity the EMA policy had there, ``v_old = v_ema(x_i, σ_i)``, which the rollout
  computed anyway. The actor uses that ``v_old`` when it is exact (no CFG, and the adapter that sampled is bitwise
  the actor's EMA adapter at update time, checked by digest), so an NFT pass costs one forward and backward;
  otherwise it recomputes it. ``train/actor/v_old_cached`` logs the share of samples that used the cache.
"""

from __future__ import annotations

import torch

from rlrunner.algorithms.nft_loss import nft_loss
from rlrunner.algorithms.samplers import distinct_levels, sample_xt, training_grid
from rlrunner.distributed.parallelize import Engine
from rlrunner.models import EMA_ADAPTER, FlowModel
from rlrunner.models.lora import lora_digest
from rlrunner.objectives.base import MicroBatch, Objective

Tensor = torch.Tensor

XCUR_SOURCES = ("resample", "rollout")


class NFTObjective(Objective):
    loss_key = "nft_loss"
    sampling_adapter = EMA_ADAPTER
    #: :func:`lora_digest` of the actor's EMA adapter during an update (:meth:`begin_update`), when v_old is kept
    ema_digest: Tensor | None = None

    def draws(self) -> int:
        return int(self.alg.nft_timesteps_per_sample)  # training states per sample (resample: each fresh noise)

    def kept_latents_per_sample(self) -> int:
        return self.draws() * (2 if self.keeps_velocity else 1) if self.from_rollout else 0  # states (+ v_old)

    @property
    def from_rollout(self) -> bool:
        return self.alg.nft_xcur_source == "rollout"

    @property
    def keeps_velocity(self) -> bool:
        """Whether the rollout keeps ``v_old``: the sampler's velocity is v_ema itself when a step is one pass
        (no guidance, or FLUX.1's embedded scale, a model input the loss feeds alike); under CFG it is the guided
        combination of two passes, not v_ema."""
        return self.from_rollout and self.guidance.passes == 1

    def rollout(self, model: FlowModel, cond: dict[str, Tensor], noise: Tensor,
                generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """The ODE rollout; with ``nft_xcur_source: rollout`` it also keeps, per sample ``[N, D, ...]`` with
        D = ``nft_timesteps_per_sample``: ``nft_xcur`` (float32 states x_i), ``nft_t`` (``[N, D]`` their sigmas σ_i),
        and without CFG ``nft_v_old`` (float32 v_ema(x_i, σ_i)) with ``nft_sampler_digest`` (``[N, 2]`` int64,
        :func:`lora_digest` of the sampling adapter)."""
        if not self.from_rollout:
            return super().rollout(model, cond, noise, generator)
        num_steps = int(self.family.num_steps)
        # D distinct steps per sample: the first D of a random permutation of 0..N-1
        steps = torch.rand((noise.shape[0], num_steps), generator=generator, device=generator.device).argsort(dim=1)
        recorder = StateRecorder(steps[:, : self.draws()].cpu(), num_steps, keep_velocity=self.keeps_velocity)
        x0 = self.sample(model, cond, noise, observer=recorder)
        kept = recorder.kept()
        if self.keeps_velocity:
            digest = lora_digest(model.lora_state_dict(self.sampling_adapter))
            kept["nft_sampler_digest"] = digest.expand(noise.shape[0], -1).clone()
        return x0, kept

    def begin_update(self, model: FlowModel) -> None:
        self.ema_digest = lora_digest(model.lora_state_dict(EMA_ADAPTER)) if self.keeps_velocity else None

    def loss(self, model: FlowModel, engine: Engine, micro: MicroBatch) -> tuple[Tensor, dict[str, float]]:
        """NFT loss at ``(x_t, t)`` of :attr:`alg.nft_xcur_source` (module docstring)."""
        alg, device = self.alg, model.device
        v_old = None
        if self.from_rollout:
            x_t, t = micro.tensors["nft_xcur"][:, micro.draw], micro.tensors["nft_t"][:, micro.draw]
            if self._cache_is_exact(micro):
                v_old = micro.tensors["nft_v_old"][:, micro.draw].to(device)
        else:
            grid = training_grid(alg.nft_train_timesteps, model.sigmas(int(self.family.num_steps)))
            levels = self._distinct_levels(micro, grid.numel()) if self.draws() > 1 else None
            x_t, t, _ = sample_xt(micro.x0, grid, generator=micro.generators, levels=levels)
        # float32 latents: the model casts its input to its own dtype and returns velocities in the input's
        # dtype, so the NFT loss runs in float32 even for a bf16 transformer
        x0, x_t, t = micro.x0.to(device), x_t.to(device), t.to(device)
        cached = v_old is not None
        with torch.no_grad():
            if v_old is None:
                v_old = model.velocity(x_t, t, micro.cond, adapter=EMA_ADAPTER)
            v_base = model.velocity(x_t, t, micro.cond, adapter=None) if alg.ref_kl_coef > 0 else None
        v_theta = engine.velocity(x_t, t, micro.cond)  # the trained adapter, through DDP / FSDP2
        loss, metrics = nft_loss(
            v_theta, v_old, x_t, x0, t, micro.advantages.to(device), beta=alg.nft_beta, adv_clip_max=alg.adv_clip_max,
            weight_mode=alg.nft_weight_mode, target_space=alg.nft_target_space, clip_ratio=alg.nft_clip_ratio,
            v_base=v_base, kl_coef=alg.ref_kl_coef, adv_mode=alg.nft_adv_mode,
        )
        return loss, {**metrics, "v_old_cached": float(cached)}

    def _distinct_levels(self, micro: MicroBatch, num_levels: int) -> Tensor:
        """int64 ``[B]``: each sample's grid index for this draw, entry ``micro.draw`` of its distinct levels."""
        if len(micro.level_generators) != len(micro.x0):
            raise RuntimeError(f"nft_timesteps_per_sample > 1 needs one level generator per sample; got "
                               f"{len(micro.level_generators)} for {len(micro.x0)} samples")
        return torch.stack([distinct_levels(num_levels, self.draws(), g)[micro.draw]
                            for g in micro.level_generators])

    def _cache_is_exact(self, micro: MicroBatch) -> bool:
        """The rollout kept v_old, and every sample of ``micro`` was sampled by the actor's current EMA adapter."""
        digest = self.ema_digest
        return digest is not None and bool((micro.tensors["nft_sampler_digest"] == digest).all())


class StateRecorder:
    """A :func:`~rlrunner.algorithms.samplers.sample_flow` observer that keeps, for each sample, the states (and
    velocities) of its chosen steps: ``steps`` int64 ``[N, D]`` on the CPU, the step indices i of sample n's D slots.
    Step i is the i-th velocity evaluation (each sampler evaluates v once per step, at x_i and σ_i)."""

    def __init__(self, steps: Tensor, num_steps: int, keep_velocity: bool) -> None:
        self.steps, self.num_steps, self.keep_velocity = steps, num_steps, keep_velocity
        self.step = 0
        self.x: Tensor | None = None
        self.t: Tensor | None = None
        self.v: Tensor | None = None

    def __call__(self, x: Tensor, t: Tensor, v: Tensor) -> None:
        if self.x is None:
            n, d = self.steps.shape
            self.x = x.new_zeros((n, d, *x.shape[1:]), dtype=torch.float32)
            self.t = t.new_zeros((n, d), dtype=torch.float32)
            self.v = self.x.clone() if self.keep_velocity else None
        rows, slots = (self.steps == self.step).nonzero(as_tuple=True)  # CPU indices: no device sync
        if len(rows):
            rows_on_device, slots_on_device = rows.to(x.device), slots.to(x.device)
            self.x[rows_on_device, slots_on_device] = x[rows_on_device].float()
            self.t[rows_on_device, slots_on_device] = t[rows_on_device].float()
            if self.v is not None:
                self.v[rows_on_device, slots_on_device] = v[rows_on_device].float()
        self.step += 1

    def kept(self) -> dict[str, Tensor]:
        """``nft_xcur`` ``[N, D, ...]``, ``nft_t`` ``[N, D]`` and, if kept, ``nft_v_old`` ``[N, D, ...]``."""
        if self.step != self.num_steps:  # step i's state is the i-th evaluation only at one evaluation per step
            raise RuntimeError(f"the sampler evaluated the velocity {self.step} times in {self.num_steps} steps; "
                               f"nft_xcur_source=rollout needs one evaluation per step")
        kept = {"nft_xcur": self.x, "nft_t": self.t}
        if self.v is not None:
            kept["nft_v_old"] = self.v
        return kept

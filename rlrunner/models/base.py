"""The one interface every model family implements (placement of its parts: :mod:`rlrunner.models.placement`;
pixel and latent helpers: :mod:`rlrunner.models.pixels`).

A :class:`FlowModel` wraps a rectified-flow denoiser (``x_t = (1 - t) x0 + t eps``, the network predicts
``v = eps - x0``) plus whatever turns prompts into conditioning and latents into pixels. Workers only ever
talk to this interface, so SD3 / Wan / Qwen-Image / tiny differences never leak out of ``models/``.

Two LoRA adapters live on one denoiser: ``default`` (trained by the actor) and ``ema`` (the "old" policy used
for rollouts and for ``v_old``); :mod:`rlrunner.models.lora` holds them, ``FlowModel`` forwards to it.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any

import numpy as np
import torch
from torch import nn

from rlrunner.algorithms.samplers import VelocityFn, VelocityObserver, sample_flow, sigma_schedule
from rlrunner.models.build import BuildHooks, build_family
from rlrunner.models.guidance import PLAIN_COMBINE, Guidance, resolve
from rlrunner.models.lora import ADAPTERS, EMA_ADAPTER, TRAINED_ADAPTER, LoraAdapters, saved_config, write_lora
from rlrunner.models.placement import ComponentPlacement
from rlrunner.models.schedules import pipeline_sigmas
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.shapes import ActivationProfile, SampleShapes

Cond = dict[str, torch.Tensor]


# --------------------------------------------------------------------------------------------------- interface
class FlowModel(ComponentPlacement, BuildHooks, abc.ABC):
    """Base class of the model families.

    :meth:`load` builds a family by the hooks of :mod:`rlrunner.models.build`, in their order (the pipeline, its
    checks, the guidance, the denoiser, the shapes, LoRA, placement); a family sets the class attributes below,
    overrides hooks (:data:`~rlrunner.models.build.FAMILY_HOOKS`) and implements the abstract methods. What it
    holds afterwards: ``self.transformer`` (the denoiser), ``self.text_encoders`` / ``self.vae`` (offloading and
    :meth:`release_text_encoders` / :meth:`release_vae` work for all families), ``self.shapes`` and
    ``self.resolved_guidance`` (:class:`~rlrunner.models.guidance.Guidance`, resolved once).
    """

    #: the recipe's ``actor.model.model_type`` of this family
    model_type: str = ""
    #: diffusers pipeline class of the model folder
    pipeline_class_name: str = ""
    #: that pipeline's LoRA loader mixin (``diffusers.loaders``): it writes our adapter files, which the
    #: pipeline's ``load_lora_weights`` reads
    lora_loader_class_name: str = ""
    #: diffusers class of the family's VAE, loaded in float32 (the decoding precision) by :meth:`load`
    vae_class_name: str = ""
    lora_target_modules: tuple[str, ...] = ()
    #: the pipeline's name of the denoiser, which prefixes the keys of its LoRA files
    lora_component: str = "transformer"
    #: the pipeline's ``load_lora_weights`` keyword arguments, one call per file :meth:`save_lora` may write (a
    #: two-expert family writes a second file for its second expert)
    lora_load_calls: tuple[dict[str, Any], ...] = ({},)
    #: the pipeline components of a denoiser made of experts routed by sigma (empty: one denoiser)
    expert_components: tuple[str, ...] = ()
    #: images per VAE decode call (bounds decode memory at full resolution)
    decode_batch_size: int = 8
    #: what the denoiser and VAE hold while they run: the structure (sizing.memory.family_profile adds the constants)
    activation_profile: ActivationProfile = ActivationProfile()
    #: the family whose recorded recipes measure this one's activation constants (None: its own)
    activations_measured_by: str | None = None
    #: how the family's :meth:`combine_guidance` combines the ``cfg`` halves (``Guidance.combine``)
    guidance_combine: str = PLAIN_COMBINE
    #: with ``use_lora: false`` the whole denoiser trains (tiny); otherwise it stays frozen
    full_finetune_without_lora: bool = False
    #: the guidance kinds (:data:`~rlrunner.models.guidance.GUIDANCE_KINDS` but ``auto``) this family's pipeline
    #: supports; the first is what ``guidance: auto`` picks unless the ``guidance_kind`` hook reads the folder
    guidance_kinds: tuple[str, ...] = ("cfg",)
    #: the family settings (``FamilyConfig`` keys) that only some families read and this one does: a dry run shows
    #: a family's section without the others' own settings
    own_settings: tuple[str, ...] = ()
    #: the dataclass of this family's recipe section ``actor.model.<model_type>`` (its defaults, and any keys of its
    #: own): a subclass of FamilyConfig, which the recipe schema gives the section (rlrunner/models/settings.py)
    settings_type: type[FamilyConfig] = FamilyConfig
    #: the pipeline's text encoder attributes this family encodes prompts with (those the folder has)
    text_encoder_names: tuple[str, ...] = ("text_encoder",)

    def __init__(self, family_cfg: Any, *, device: torch.device, dtype: torch.dtype) -> None:
        self.cfg = family_cfg
        self.device = device
        self.dtype = dtype
        self.transformer: nn.Module
        self.shapes: SampleShapes
        self.resolved_guidance: Guidance
        self.text_encoders: dict[str, nn.Module] = {}
        self.vae: nn.Module | None = None
        self.lora: LoraAdapters | None = None
        self._negative_cond: Cond | None = None
        # num_steps -> the schedule as float32 values (a pipeline's rule builds a scheduler: done once per step count)
        self._sigmas: dict[int, tuple[float, ...]] = {}

    @classmethod
    def load(cls, model_path: str, family_cfg: Any, *, device: torch.device, dtype: torch.dtype,
             denoiser_only: bool = False, denoiser_on_host: bool = False) -> FlowModel:
        """Build from a diffusers pipeline folder or hub id (:func:`~rlrunner.models.build.build_family`): VAE in
        fp32 (decoding precision), the rest in ``dtype``; ``denoiser_only``: without text encoders, tokenizers and
        VAE, never read; ``denoiser_on_host``: the denoiser left in host memory (the caller places it)."""
        return build_family(cls, model_path, family_cfg, device=device, dtype=dtype, denoiser_only=denoiser_only,
                            denoiser_on_host=denoiser_on_host)

    @classmethod
    def check_model_index(cls, index: dict[str, Any], where: str) -> None:
        """Refuse a ``model_index.json`` (``index``, read from ``where``) that this family cannot load, with one
        line; families with more requirements (a second expert) extend it."""
        found = index.get("_class_name", "")
        if found != cls.pipeline_class_name:
            raise ValueError(f"{where} holds a {found or 'unknown'} pipeline, but model_type {cls.model_type!r} "
                             f"expects a {cls.pipeline_class_name}; fix model_type (or use auto) or the path")

    @classmethod
    def matches_model_index(cls, index: dict[str, Any]) -> bool:
        """Whether ``model_type: auto`` picks this family for a folder with this ``model_index.json``."""
        try:
            cls.check_model_index(index, "model_index.json")
        except ValueError:
            return False
        return True

    @classmethod
    def resolve_guidance(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> Guidance:
        """The recipe's guidance on the folder whose config dicts are ``configs`` (empty: a hub id, the recipe
        alone) as one :class:`~rlrunner.models.guidance.Guidance`: the kind from the ``guidance_kind`` hook, the
        scales checked against it. A bad setting is a ``ValueError`` of one line naming the key."""
        return resolve(cls, family_cfg, cls.guidance_kind(family_cfg, configs))

    @property
    def guidance(self) -> str:
        """The guidance kind in force (``self.resolved_guidance.kind``)."""
        return self.resolved_guidance.kind

    # ------------------------------------------------------------------ family-specific
    @property
    def latent_shape(self) -> tuple[int, ...]:
        """Shape of one sample's latent: ``(C, H, W)`` for images, ``(C, F, H, W)`` for video."""
        return self.shapes.latent

    @abc.abstractmethod
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """Text conditioning for ``prompts``; every tensor is batch-first ``[B, ...]`` on ``self.device``."""

    @abc.abstractmethod
    def _predict_velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: Cond,
                          guidance: torch.Tensor | None = None) -> torch.Tensor:
        """One denoiser call with whatever adapter is active. ``t``: ``[B]`` sigmas in [0, 1]; ``guidance``: ``[B]``
        float32 scales for ``embedded`` guidance (``None`` otherwise)."""

    def schedule_kwargs(self, num_steps: int) -> dict[str, Any]:
        """The family's schedule rule: what its pipeline passes to ``scheduler.set_timesteps`` for ``num_steps``
        (:mod:`rlrunner.models.schedules`); the default is the scheduler's own spacing (SD3, Wan)."""
        return {"num_inference_steps": num_steps}

    @abc.abstractmethod
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """Latents to uint8 pixels: ``[B, H, W, 3]`` for images, ``[B, F, H, W, 3]`` when :attr:`is_video`."""

    # ------------------------------------------------------------------ shared behaviour
    def _option(self, name: str) -> bool:
        """A boolean family setting; absent (a family config without it) counts as off."""
        return bool(getattr(self.cfg, name, False))

    @property
    def is_video(self) -> bool:
        """Whether :meth:`decode` returns frames ``[B, F, H, W, 3]`` (video families at num_frames 1 do not)."""
        return len(self.latent_shape) == 4

    def concat_cond(self, conds: list[Cond]) -> Cond:
        """Concatenate conditionings along the batch (families with ragged text lengths override this)."""
        return {k: torch.cat([c[k] for c in conds]) for k in conds[0]}

    def repeat_cond(self, cond: Cond, repeats: int) -> Cond:
        """Each row ``repeats`` times, contiguously (``[p0, p0, p1, p1]``): one prompt group per prompt."""
        return {k: v.repeat_interleave(repeats, dim=0) for k, v in cond.items()}

    def negative_cond(self, batch_size: int) -> Cond:
        """Conditioning of ``cfg.negative_prompt`` (encoded once, cached) repeated to ``batch_size`` rows."""
        if self._negative_cond is None:
            self._negative_cond = self.encode_prompts([str(self.cfg.negative_prompt)])
        return self.repeat_cond(self._negative_cond, batch_size)

    def velocity(
        self, latents: torch.Tensor, t: torch.Tensor, cond: Cond, adapter: str | None = TRAINED_ADAPTER
    ) -> torch.Tensor:
        """``v(x_t, t)`` with ``adapter`` active (``None`` = base model, adapters off).

        latents: ``[B, *latent_shape]``; t: ``[B]`` in [0, 1] (1 = noise). Returns ``[B, *latent_shape]`` in
        ``latents``' dtype. With gradient checkpointing, backward re-runs the blocks with ``default`` active,
        so a call that records a graph must use ``default`` (``v_old`` / ``v_base`` go under ``torch.no_grad()``).
        """
        if adapter != TRAINED_ADAPTER and torch.is_grad_enabled() and self._option("gradient_checkpointing"):
            raise RuntimeError(f"velocity(adapter={adapter!r}) with gradients and gradient checkpointing would be "
                               f"recomputed with the {TRAINED_ADAPTER!r} adapter in backward; wrap it in "
                               f"torch.no_grad()")
        # embedded guidance is part of the policy: trained at the scale the training rollouts used
        guidance = self._embedded_guidance(self.resolved_guidance.scale, t)
        with self.use_adapter(adapter):
            return self._predict_velocity(latents, t, cond, guidance).to(latents.dtype)

    def _embedded_guidance(self, guidance_scale: float, t: torch.Tensor) -> torch.Tensor | None:
        """``[B]`` float32 guidance input for ``embedded`` guidance, else ``None``."""
        if self.guidance != "embedded":
            return None
        return torch.full(t.shape, guidance_scale, dtype=torch.float32, device=t.device)

    @torch.no_grad()
    def sample(
        self,
        cond: Cond,
        noise: torch.Tensor,
        *,
        sampler: str,
        num_steps: int,
        guidance_scale: float = 1.0,
        negative_cond: Cond | None = None,
        adapter: str | None = EMA_ADAPTER,
        return_trajectory: bool = False,
        observer: VelocityObserver | None = None,
        guidance_scale_2: float | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Integrate the flow ODE from ``noise`` (t = 1) to a clean latent (t = 0).

        cond: ``[B, ...]`` tensors; noise: ``[B, *latent_shape]`` (float32 keeps the update math in fp32); guidance
        as in :meth:`guided_velocity_fn`, ``guidance_scale_2`` too (an ``observer`` sees the guided velocity, see
        :func:`sample_flow`).
        Returns x0 ``[B, *latent_shape]`` (and the N + 1 states if ``return_trajectory``).
        """
        # the second scale only where one is set (validation allows it only for a family with experts)
        low_noise = {} if guidance_scale_2 is None else {"guidance_scale_2": guidance_scale_2}
        velocity_fn = self.guided_velocity_fn(cond, guidance_scale, negative_cond, **low_noise)
        with self.use_adapter(adapter):
            return sample_flow(velocity_fn, noise, self.sigmas(num_steps, noise.device), sampler=sampler,
                               return_trajectory=return_trajectory, observer=observer)

    def sigmas(self, num_steps: int, device: torch.device | str | None = None) -> torch.Tensor:
        """The sampling grid ``[num_steps + 1]`` (float32, 1 to 0): the pipeline's own schedule from the model
        folder's scheduler (:meth:`schedule_kwargs`), or the plain grid shifted by the recipe's ``shift``."""
        if num_steps not in self._sigmas:
            shift = getattr(self.cfg, "shift", None)
            if shift is not None:
                sigmas = sigma_schedule(num_steps, shift=float(shift))
            else:
                scheduler = getattr(getattr(self, "pipe", None), "scheduler", None)
                if scheduler is None:
                    raise ValueError(f"actor.model.{self.model_type}.shift is null but this model has no scheduler to "
                                     f"take the schedule from; set shift to a number")
                sigmas = pipeline_sigmas(scheduler, self.schedule_kwargs(num_steps))
            self._sigmas[num_steps] = tuple(sigmas.tolist())
        return torch.tensor(self._sigmas[num_steps], dtype=torch.float32, device=device)

    def guided_velocity_fn(self, cond: Cond, guidance_scale: float = 1.0, negative_cond: Cond | None = None,
                           guidance_scale_2: float | None = None) -> VelocityFn:
        """``(x [B, ...], t [B]) -> v`` with whatever adapter is active, for the samplers.

        By :attr:`guidance`: ``cfg`` with ``guidance_scale > 1`` runs the ``negative_cond`` and conditional halves
        in one batched call and combines them with :meth:`combine_guidance` (``negative_cond`` defaults to
        ``cfg.negative_prompt`` and may have batch 1); ``embedded`` passes the scale to the denoiser; ``none``
        (or a scale of 1) is one plain pass. ``guidance_scale_2``: the low-noise expert's scale of a family with
        :attr:`expert_components` (None: ``guidance_scale``); one denoiser has no use for it.
        """
        kind = self.guidance
        if kind == "none" and guidance_scale != 1.0:
            raise ValueError(f"guidance_scale={guidance_scale} on a model sampled without guidance "
                             f"(actor.model.{self.model_type}.guidance=none); use 1.0")
        if kind == "embedded":
            def embedded_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                return self._predict_velocity(x.to(self.dtype), t, cond, self._embedded_guidance(guidance_scale, t))

            return embedded_fn
        use_cfg = kind == "cfg" and guidance_scale > 1.0
        if use_cfg:
            batch = next(iter(cond.values())).shape[0]
            negative_cond = negative_cond if negative_cond is not None else self.negative_cond(1)
            if next(iter(negative_cond.values())).shape[0] == 1 and batch > 1:
                negative_cond = self.repeat_cond(negative_cond, batch)
            cond = self.concat_cond([negative_cond, cond])

        def velocity_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            if not use_cfg:
                return self._predict_velocity(x.to(self.dtype), t, cond)
            v_neg, v_cond = self._predict_velocity(torch.cat([x, x]).to(self.dtype), torch.cat([t, t]), cond).chunk(2)
            return self.combine_guidance(v_neg, v_cond, guidance_scale)

        return velocity_fn

    def combine_guidance(self, v_neg: torch.Tensor, v_cond: torch.Tensor, guidance_scale: float) -> torch.Tensor:
        """Guided velocity from the negative and conditional halves (``[B, *latent_shape]`` each, model dtype).

        ``v_neg + g (v_cond - v_neg)``, as the SD3 and Wan pipelines; a family whose pipeline combines them
        otherwise overrides this, so that rollouts match the pipeline users load the exported adapter into.
        """
        return v_neg + guidance_scale * (v_cond - v_neg)

    def setup_denoiser(self) -> None:
        """Build step 7: freeze, optionally checkpoint, add the LoRA adapters (and load ``lora_path``); with
        ``use_lora: false`` the denoiser trains whole only where :attr:`full_finetune_without_lora`."""
        self.transformer.requires_grad_(False).eval()
        if self._option("gradient_checkpointing"):
            self.transformer.enable_gradient_checkpointing()
        if self.cfg.use_lora:
            self._add_lora_adapters(int(self.cfg.lora_rank), int(self.cfg.lora_alpha))
            if self.cfg.lora_path:
                self.load_lora(str(self.cfg.lora_path))
        elif self.full_finetune_without_lora:
            self.transformer.requires_grad_(True)

    # ------------------------------------------------------------------ LoRA adapters (models/lora.py)
    def _add_lora_adapters(self, rank: int, alpha: int) -> None:
        """Put the ``default`` and ``ema`` LoRA adapters (same init, float32) on the denoiser, base frozen."""
        self.lora = LoraAdapters(self.transformer, self.lora_target_modules, rank, alpha,
                                 exclude_modules=self.lora_exclude_modules(self.transformer))

    @classmethod
    def adapted_components(cls, family_cfg: Any) -> tuple[str, ...]:
        """The pipeline components that get LoRA adapters at ``family_cfg``'s settings (the memory plan counts
        them): the denoiser, or the experts a two-expert family trains."""
        return cls.expert_components or (cls.lora_component,)

    @classmethod
    def lora_exclude_modules(cls, denoiser: nn.Module) -> tuple[str, ...]:
        """Modules of ``denoiser`` among the LoRA targets whose output it discards (no adapter there: it would never
        get a gradient, and DDP cannot reduce a parameter without one); none by default. A classmethod, so that the
        memory plan counts the same adapter on a meta-device denoiser."""
        return ()

    def use_adapter(self, adapter: str | None) -> contextlib.AbstractContextManager[None]:
        """Run the block with ``adapter`` active (``None``: base model), then restore ``default``."""
        if adapter is not None and adapter not in ADAPTERS:
            raise ValueError(f"unknown adapter {adapter!r}; valid: {list(ADAPTERS)} or None (base model)")
        if self.lora is None:
            if adapter is not None:
                raise ValueError(f"adapter {adapter!r} asked for, but this model has no LoRA (use_lora: false)")
            return contextlib.nullcontext()
        return self.lora.use(adapter)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.transformer.parameters() if p.requires_grad]

    def adapter_parameters(self, adapter: str) -> list[torch.Tensor]:
        """The adapter's LoRA tensors in a fixed order (the same order for both adapters)."""
        return self._adapters().parameters(adapter)

    def adapter_named_parameters(self, adapter: str) -> dict[str, torch.Tensor]:
        """The adapter's live LoRA tensors keyed as :meth:`lora_state_dict` (no copy, no gather)."""
        return self._adapters().named_parameters(adapter)

    def lora_state_dict(self, adapter: str) -> dict[str, torch.Tensor]:
        """LoRA tensors of ``adapter`` with the adapter name stripped from the keys (detached full copies, CPU).

        Tensors sharded over ranks (DTensors) are gathered, so every rank of the group must call it.
        """
        return self._adapters().state_dict(adapter)

    def load_lora_state_dict(self, adapter: str, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` (as returned by :meth:`lora_state_dict`) into ``adapter``; keys and shapes must match."""
        self._adapters().load_state_dict(adapter, state)

    def save_lora(self, directory: str, adapter: str = TRAINED_ADAPTER,
                  state: dict[str, torch.Tensor] | None = None) -> None:
        """Write ``adapter`` so that diffusers' ``pipe.load_lora_weights(directory)`` loads it; ``state``: the
        adapter's :meth:`lora_state_dict` when the caller already has it (default: read it now)."""
        self._adapters().save(directory, adapter, self.lora_loader_class_name, self.lora_component, state)

    @classmethod
    def write_lora_files(cls, directory: str, state: dict[str, torch.Tensor], family_cfg: Any) -> None:
        """Write an adapter's tensors (a :meth:`lora_state_dict`) as :meth:`save_lora` does, without a model: the
        LoRA settings come from ``family_cfg`` (``lora_rank``, ``lora_alpha``), so the driver can write the files
        of tensors a worker returned."""
        config = saved_config(cls.lora_target_modules, int(family_cfg.lora_rank), int(family_cfg.lora_alpha))
        write_lora(directory, state, config, cls.lora_loader_class_name, cls.lora_component)

    def load_lora(self, path: str, adapters: tuple[str, ...] = ADAPTERS) -> None:
        """Load a diffusers-format LoRA (folder, file or hub id, e.g. from :meth:`save_lora`) into ``adapters``."""
        self._adapters().load(path, adapters, self.lora_loader_class_name, self.lora_component)

    # ------------------------------------------------------------------ context parallelism
    #: ranks that split one sample's token sequence (1: none); set by :meth:`enable_context_parallel`
    context_parallel_size: int = 1
    #: whether the family pads its text to whole CP slices itself, where its ``_cp_plan`` splits the text (else the
    #: recipe check asks ``max_sequence_length`` to divide)
    pads_text_for_cp: bool = False

    def enable_context_parallel(self, mesh: Any) -> None:
        """Split every denoiser's token sequence over the CP groups of ``mesh`` (a ``dp × cp`` device mesh, see
        :mod:`rlrunner.distributed.context_parallel`) through its diffusers ``_cp_plan`` hooks; before FSDP2 wraps it."""
        from rlrunner.distributed.context_parallel import apply_context_parallel

        for denoiser in [getattr(self.transformer, name) for name in self.expert_components] or [self.transformer]:
            apply_context_parallel(denoiser, mesh)
        self.context_parallel_size = mesh["ring"].size() * mesh["ulysses"].size()

    def _adapters(self) -> LoraAdapters:
        if self.lora is None:
            raise ValueError("this model has no LoRA adapters (use_lora: false)")
        return self.lora

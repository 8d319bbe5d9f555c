"""Wan2.2 T2V-A14B (``model_type: wan22_t2v_a14b``): two WanTransformer3DModel experts routed by sigma.

``diffusers.WanPipeline`` with ``transformer_2`` and ``boundary_ratio`` (0.875 for T2V) denoises step ``t`` (its
timestep, ``1000 * sigma``) with ``transformer`` (the high-noise expert) while ``t >= boundary_ratio *
num_train_timesteps``, then with ``transformer_2``, and guides the low-noise expert with ``guidance_scale_2``
(defaulting to ``guidance_scale``; guidance is on only when ``guidance_scale > 1``). Everything else (UMT5, the
16-channel 8x VAE, one timestep per sample) is Wan2.1's, in :mod:`rlrunner.models.wan`.

Design: both experts live in one module, :class:`SigmaExperts`, under the pipeline's own component names. The
shared code (LoRA adapters, state dicts and weight sync, ``.to()`` for offload, DDP, FSDP2's per-block wrapping via
``_no_split_modules``, checkpoints) sees one module tree whose parameter names start with the expert's name; the
routing happens in its forward, row by row, so a training micro-batch whose timesteps straddle the boundary is
split, each expert computes its rows, and the rows are put back in order.

An expert with no rows in a call still runs, on a few tokens of zeros whose output enters with weight 0, where a
wrapper needs it: under DDP when it trains (gradients on, its adapter trainable), under FSDP2 when some other rank
of the group has rows for it. Under DDP its adapter then gets an exact zero gradient (the loss does not depend on it
this step) instead of none: DDP reduces every parameter it registered in every step (a parameter without a gradient
leaves its bucket unreduced, the ranks drift, and the next step fails with "Expected to have finished reduction").
FSDP2 all-gathers an expert's blocks only when every rank runs them, so the ranks decide together (one all-reduce of
two flags per call) and an expert that no rank has rows for is not run at all: its 40 blocks are not gathered on that
micro-batch. FSDP2 reduces the gradients it accumulated earlier in the step at the sync pass whether or not the
expert ran then, and the engine gives an adapter that ran in none of the step's micro-batches a zero gradient
(:class:`~rlrunner.distributed.parallelize.FSDP2Engine`), so AdamW sees what it sees on one device, where the dummy
gives a zero gradient too. The results do not depend on the rank count; AdamW treats the idle expert as it treats
any zero gradient (its moments decay). The dummy is one token per rank of the context-parallel group
(:func:`idle_tokens`): diffusers' CP hooks split the sequence and refuse one that does not divide by the group
size. It costs 40 block calls on those tokens (no measurable compute).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlrunner.algorithms.samplers import VelocityFn
from rlrunner.models.base import Cond
from rlrunner.models.guidance import low_noise_in_force
from rlrunner.models.lora import ADAPTERS, TRAINED_ADAPTER, saved_config, write_lora
from rlrunner.models.wan import LAYOUTS, Wan21Settings, WanFlowModel

#: ``actor.model.wan22_t2v_a14b.train_experts`` -> the experts that get LoRA adapters (and train)
TRAIN_EXPERTS = {"both": ("transformer", "transformer_2"), "high": ("transformer",), "low": ("transformer_2",)}
#: the LoRA file of each expert, as diffusers' WanLoraLoaderMixin reads them (the second with
#: ``load_into_transformer_2=True``); both hold keys ``transformer.<module>``
LORA_FILES = {"transformer": "pytorch_lora_weights.safetensors",
              "transformer_2": "pytorch_lora_weights_transformer_2.safetensors"}


class SigmaExperts(nn.Module):
    """The high-noise expert ``transformer`` and the low-noise expert ``transformer_2`` as one module.

    Args:
        high, low: the two ``WanTransformer3DModel`` experts.
        boundary_timestep: ``boundary_ratio * num_train_timesteps``; a row with timestep ``>=`` it goes to ``high``.
        adapted: the names of the experts that get LoRA adapters (:data:`TRAIN_EXPERTS`).
    """

    def __init__(self, high: nn.Module, low: nn.Module, boundary_timestep: float, adapted: tuple[str, ...]) -> None:
        super().__init__()
        self.transformer, self.transformer_2 = high, low
        self.boundary_timestep = float(boundary_timestep)
        self.adapted = adapted
        # FSDP2 shards each block, then each expert (so one expert's embeddings are gathered only when it runs)
        self._no_split_modules = [*high._no_split_modules, type(high).__name__]

    @property
    def experts(self) -> dict[str, nn.Module]:
        return {"transformer": self.transformer, "transformer_2": self.transformer_2}

    # ------------------------------------------------------------------ what LoraAdapters and FlowModel call
    def add_adapter(self, config: Any, adapter_name: str) -> None:
        for name in self.adapted:
            self.experts[name].add_adapter(config, adapter_name=adapter_name)

    @property
    def peft_config(self) -> dict[str, Any]:
        return self.experts[self.adapted[0]].peft_config

    def enable_gradient_checkpointing(self) -> None:
        for expert in self.experts.values():
            expert.enable_gradient_checkpointing()

    # ------------------------------------------------------------------ routing
    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor,
                return_dict: bool = False) -> tuple[torch.Tensor]:
        """hidden_states ``[B, C, F', h, w]``, timestep ``[B]`` (``1000 * sigma``), encoder_hidden_states
        ``[B, L, D]`` -> ``([B, C, F', h, w],)``: each row from its expert, in the input's row order."""
        masks = self.expert_rows(timestep)
        anywhere = self._rows_on_any_rank(masks)
        outputs, rows = [], []
        idle = None  # weight-0 outputs of experts without rows that must run anyway (module docstring)
        for (name, expert), mask, elsewhere in zip(self.experts.items(), masks, anywhere):
            index = mask.nonzero().squeeze(1)
            if len(index) == len(mask):  # every row: no copies
                outputs.append(expert(hidden_states=hidden_states, timestep=timestep,
                                      encoder_hidden_states=encoder_hidden_states, return_dict=False)[0])
                rows.append(index)
            elif len(index):
                outputs.append(expert(hidden_states=hidden_states[index], timestep=timestep[index],
                                      encoder_hidden_states=encoder_hidden_states[index], return_dict=False)[0])
                rows.append(index)
            elif self._must_run(name, expert, elsewhere):
                touch = self._idle_call(expert, hidden_states, encoder_hidden_states)
                idle = touch if idle is None else idle + touch
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs)[torch.cat(rows).argsort()]
        return (out if idle is None else out + idle,)

    def expert_rows(self, timestep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B]`` bool masks of the rows each expert computes, in :attr:`experts`' order (the pipeline's rule)."""
        high = timestep >= self.boundary_timestep
        return high, ~high

    def _rows_on_any_rank(self, masks: tuple[torch.Tensor, ...]) -> list[bool]:
        """Per expert, whether some rank has rows for it: under FSDP2 every rank joins one all-reduce of the flags
        (every rank makes the same engine calls, so each reaches this one); otherwise this rank's own rows."""
        flags = torch.stack([mask.any() for mask in masks]).to(torch.int32)
        group = _fsdp_group(self.transformer)
        if group is not None:
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX, group=group)
        return [bool(flag) for flag in flags.tolist()]

    def _must_run(self, name: str, expert: nn.Module, rows_elsewhere: bool) -> bool:
        """Whether an expert without rows here runs the dummy: under FSDP2 when another rank runs it (its blocks'
        all-gathers need every rank); otherwise when it trains (DDP reduces every trained parameter)."""
        if _fsdp_group(expert) is not None:
            return rows_elsewhere
        return torch.is_grad_enabled() and name in self.adapted

    def _idle_call(self, expert: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor
                   ) -> torch.Tensor:
        """0 x the expert's output on :func:`idle_tokens` patches of zeros with one zero text token: a scalar 0 that
        depends on every parameter the expert uses."""
        patch_t, patch_h, patch_w = tuple(expert.config.patch_size)
        latent = hidden_states.new_zeros((1, hidden_states.shape[1], patch_t, patch_h * idle_tokens(expert), patch_w))
        text = encoder_hidden_states.new_zeros((1, 1, encoder_hidden_states.shape[2]))
        timestep = torch.full((1,), self.boundary_timestep, device=hidden_states.device)
        out = expert(hidden_states=latent, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]
        return out.sum() * 0


def idle_tokens(expert: nn.Module) -> int:
    """The tokens of an idle expert's dummy call: one per rank of the context-parallel group its diffusers CP hooks
    split the sequence over (``_parallel_config``, set by :func:`~rlrunner.distributed.context_parallel.
    apply_context_parallel`), so that the split is even; 1 without CP."""
    config = getattr(expert, "_parallel_config", None)
    cp = getattr(config, "context_parallel_config", None)
    return cp.ring_degree * cp.ulysses_degree if cp is not None else 1


def _fsdp_group(module: nn.Module) -> Any:
    """The process group FSDP2 shards ``module`` over (that of its parameters' mesh), or None when it is not
    sharded by FSDP2."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if not isinstance(module, FSDPModule):
        return None
    param = next(module.parameters(), None)
    return param.device_mesh.get_group() if isinstance(param, DTensor) else torch.distributed.group.WORLD


class WanA14BFlowModel(WanFlowModel):
    """Wan2.2 T2V-A14B behind :class:`~rlrunner.models.base.FlowModel`: Wan2.1's shapes (latents
    ``[B, 16, F', H/8, W/8]``) with two experts (module docstring). ``self.transformer`` is a :class:`SigmaExperts`;
    LoRA keys start with ``transformer.`` or ``transformer_2.``."""

    model_type = "wan22_t2v_a14b"
    settings_type = Wan21Settings
    own_settings = (*WanFlowModel.own_settings, "train_experts", "guidance_scale_2", "eval_guidance_scale_2")
    expert_components = ("transformer", "transformer_2")
    lora_load_calls = ({}, {"weight_name": LORA_FILES["transformer_2"], "load_into_transformer_2": True})

    @classmethod
    def check_model_index(cls, index: dict[str, Any], where: str) -> None:
        """A WanPipeline folder with both ``transformer_2`` and ``boundary_ratio``."""
        super().check_model_index(index, where)
        second = index.get("transformer_2")
        if not (isinstance(second, (list, tuple)) and any(second)) or index.get("boundary_ratio") is None:
            raise ValueError(f"{where} lacks transformer_2 or boundary_ratio, but model_type {cls.model_type!r} "
                             f"expects {LAYOUTS[cls.model_type]}; point model_path at a Wan2.2 A14B folder")

    @classmethod
    def adapted_components(cls, family_cfg: Any) -> tuple[str, ...]:
        return TRAIN_EXPERTS.get(str(family_cfg.train_experts), cls.expert_components)

    def denoiser(self, pipe: Any) -> nn.Module:
        """Both experts in one :class:`SigmaExperts`, the boundary as the pipeline computes it."""
        choice = str(self.cfg.train_experts)
        if choice not in TRAIN_EXPERTS:
            raise ValueError(f"actor.model.{self.model_type}.train_experts={choice!r} is not valid; choose one of "
                             f"{list(TRAIN_EXPERTS)}")
        boundary = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
        return SigmaExperts(pipe.transformer, pipe.transformer_2, boundary, TRAIN_EXPERTS[choice])

    def is_high_noise(self, t: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """``[B]`` bool: the rows at sigmas ``t`` that the high-noise expert denoises (the pipeline's rule)."""
        return self.transformer_timestep(t, latents) >= self.transformer.boundary_timestep

    def guided_velocity_fn(self, cond: Cond, guidance_scale: float = 1.0, negative_cond: Cond | None = None,
                           guidance_scale_2: float | None = None) -> VelocityFn:
        """As :meth:`FlowModel.guided_velocity_fn`, with ``guidance_scale_2`` for the low-noise expert's steps.

        Guidance is on when ``guidance_scale > 1`` (the pipeline's ``do_classifier_free_guidance``); then the
        low-noise steps combine with ``guidance_scale_2`` (None: ``guidance_scale``). Samplers step every row at one
        sigma; with two scales, rows on both sides of the boundary in one call are an error.
        """
        high_fn = super().guided_velocity_fn(cond, guidance_scale, negative_cond)
        low_scale = low_noise_in_force(guidance_scale, guidance_scale_2)
        if low_scale == guidance_scale:
            return high_fn
        low_fn = super().guided_velocity_fn(cond, low_scale, negative_cond)

        def velocity_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            high = self.is_high_noise(t, x)
            if bool(high.all()):
                return high_fn(x, t)
            if not bool(high.any()):
                return low_fn(x, t)
            raise RuntimeError("rows on both sides of the expert boundary in one guided call with two guidance "
                               "scales; sample every row at the same sigma")

        return velocity_fn

    # ------------------------------------------------------------------ LoRA files: one per adapted expert
    def save_lora(self, directory: str, adapter: str = TRAINED_ADAPTER,
                  state: dict[str, torch.Tensor] | None = None) -> None:
        """Write ``adapter`` as diffusers loads it into WanPipeline: :data:`LORA_FILES`, one per adapted expert."""
        if adapter not in ADAPTERS:
            raise ValueError(f"unknown adapter {adapter!r}; valid: {list(ADAPTERS)}")
        self.write_lora_files(directory, state or self.lora_state_dict(adapter), self.cfg)

    @classmethod
    def write_lora_files(cls, directory: str, state: dict[str, torch.Tensor], family_cfg: Any) -> None:
        """One :data:`LORA_FILES` file per expert the tensors (a :meth:`lora_state_dict`) hold, keys without the
        expert prefix (the pipeline's loader adds ``transformer.``)."""
        config = saved_config(cls.lora_target_modules, int(family_cfg.lora_rank), int(family_cfg.lora_alpha))
        for expert, part in split_by_expert(state).items():
            write_lora(directory, part, config, cls.lora_loader_class_name, cls.lora_component,
                       weight_name=LORA_FILES[expert])

    def load_lora(self, path: str, adapters: tuple[str, ...] = ADAPTERS) -> None:
        """Load the :data:`LORA_FILES` of the adapted experts from the folder (or hub id) ``path`` into
        ``adapters``; a missing file is a ``FileNotFoundError`` naming it."""
        lora = self._adapters()
        state = {}
        for expert in self.transformer.adapted:
            part = lora.read(path, self.lora_loader_class_name, self.lora_component, weight_name=LORA_FILES[expert])
            state.update({f"{expert}.{key}": value for key, value in part.items()})
        for adapter in adapters:
            lora.load_state_dict(adapter, state)


def split_by_expert(state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """``{"transformer.blocks.0...": t, "transformer_2.blocks.0...": u}`` -> ``{"transformer": {"blocks.0...": t},
    "transformer_2": {"blocks.0...": u}}`` (experts without tensors left out)."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        expert, _, rest = key.partition(".")
        if expert not in LORA_FILES:
            raise ValueError(f"LoRA tensor {key!r} belongs to no expert (expected a prefix in {list(LORA_FILES)})")
        parts.setdefault(expert, {})[rest] = value
    return parts

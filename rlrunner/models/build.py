"""How a model family is built: one sequence of hooks, called in this order by :func:`build_family` (the whole of
:meth:`rlrunner.models.base.FlowModel.load`). A family overrides hooks; it never re-orders the calls.

=====  =========================================  ==========================================================
step   hook (``FlowModel`` default)                what it may assume, what it does
=====  =========================================  ==========================================================
1      ``load_pipeline(model_path, dtype,          classmethod; nothing built yet. Returns the pipeline object:
       denoiser_only)`` (the diffusers pipeline,   ``transformer``, ``vae``, the ``text_encoder_names``
       :func:`~rlrunner.models.loading.            (``None`` where not loaded), ``config`` (``model_index.json``)
       load_family_pipeline`)                      and ``components``.
2      ``check_pipeline(pipe)`` (nothing)          ``self.cfg`` / ``device`` / ``dtype`` and the loaded ``pipe``;
                                                   nothing held. Refuses settings the pipeline cannot run
                                                   (one-line ``ValueError``).
3      ``guidance_kind(family_cfg, configs)``      classmethod on the folder's config dicts (``model_index`` and one
       (the recipe's kind; ``auto``: the first     per component; empty for a hub id at recipe check). Returns
       of ``guidance_kinds``)                      ``cfg`` / ``embedded`` / ``none``; :meth:`FlowModel.
                                                   resolve_guidance` turns it into ``self.resolved_guidance``.
4      ``denoiser(pipe)`` (``pipe.transformer``)   ``self.cfg`` and ``pipe``. The module ``_predict_velocity``
                                                   calls; :func:`~rlrunner.models.loading.hold_pipeline` then
                                                   sets ``pipe``, ``transformer``, ``vae``, ``text_encoders``.
5      ``sample_shapes(family_cfg, configs)``      classmethod on the same config dicts as step 3 (also run by the
       (abstract)                                  recipe check and the memory plan, without weights). Becomes
                                                   ``self.shapes``.
6      ``configure(pipe)`` (nothing)               everything above is held. Reads what else the family needs
                                                   from the pipeline (Wan: ``expand_timesteps``, VAE tiling).
7      ``lora_exclude_modules(denoiser)``          classmethod; the denoiser is frozen (and checkpointed with
       (none)                                      ``gradient_checkpointing``). Names LoRA targets to skip; the
                                                   ``default`` and ``ema`` adapters are added, ``lora_path`` loaded.
=====  =========================================  ==========================================================

Then every part is placed (:meth:`~rlrunner.models.placement.ComponentPlacement._place_components`), the denoiser
left in host memory when the caller shards it first (``denoiser_on_host``, :func:`build_family`). The hooks that
run after the build (prompts, velocity, schedule, guidance combination, decoding) are :data:`RUN_HOOKS`;
``docs/adding_a_family.md`` walks through both lists and ``docs/family_template.py`` implements every hook.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlrunner.models.guidance import recipe_kind
from rlrunner.models.loading import hold_pipeline, load_family_pipeline
from rlrunner.models.shapes import SampleShapes, pipeline_configs

#: the build hooks in call order (module docstring)
BUILD_HOOKS = ("load_pipeline", "check_pipeline", "guidance_kind", "denoiser", "sample_shapes", "configure",
               "lora_exclude_modules")
#: the hooks a built model runs with (:class:`~rlrunner.models.base.FlowModel`): the abstract three and the rules a
#: family's pipeline may apply differently (schedule, batching of conditionings, guidance combination)
RUN_HOOKS = ("encode_prompts", "_predict_velocity", "decode", "schedule_kwargs", "concat_cond", "combine_guidance")
#: every hook a family may override: what ``docs/family_template.py`` defines, no more, no less
FAMILY_HOOKS = (*BUILD_HOOKS, *RUN_HOOKS)


def folder_configs(pipe: Any) -> dict[str, dict[str, Any]]:
    """The config dicts the recipe check reads from a model folder, taken from a loaded ``pipe``: ``model_index``
    (the pipeline's own config) and one per model component (:func:`~rlrunner.models.shapes.pipeline_configs`)."""
    return {"model_index": dict(pipe.config), **pipeline_configs(pipe)}


def build_family(family: type, model_path: str, family_cfg: Any, *, device: torch.device, dtype: torch.dtype,
                 denoiser_only: bool = False, denoiser_on_host: bool = False) -> Any:
    """Build ``family`` (a :class:`~rlrunner.models.base.FlowModel` subclass, which imports this module) from
    ``model_path`` at ``family_cfg``'s settings: the hooks in the module docstring's order. Returns the model.

    ``denoiser_only``: without text encoders, tokenizers and VAE, whose weights are never read (the actor's model).

    Memory during the load: diffusers reads every weight into host memory (``dtype``), the LoRA adapters are added
    there, then the parts move to ``device``. ``denoiser_on_host``: the denoiser stays in host memory, for an FSDP2
    actor (:func:`~rlrunner.distributed.parallelize.shards_from_host`): ``parallelize`` moves one block at a time to the
    device, shards it and frees the full block, so a rank's device never holds the whole denoiser (peak: its shards
    plus the largest block's or expert's non-block weights, in full); DDP and single ranks take it whole.
    """
    pipe = family.load_pipeline(model_path, dtype, denoiser_only)
    model = family(family_cfg, device=device, dtype=dtype)
    model.check_pipeline(pipe)
    configs = folder_configs(pipe)
    model.resolved_guidance = family.resolve_guidance(family_cfg, configs)
    hold_pipeline(model, pipe, model.denoiser(pipe))
    model.shapes = family.sample_shapes(family_cfg, configs)
    model.configure(pipe)
    model.setup_denoiser()
    model._place_components(denoiser_on_host)
    return model


class BuildHooks:
    """The default build hooks of :class:`~rlrunner.models.base.FlowModel` (steps 1-6 of the module docstring;
    step 7, ``lora_exclude_modules``, lives with the LoRA methods there)."""

    model_type: str
    guidance_kinds: tuple[str, ...]
    #: the most prompt tokens the family's text encoder reads (``max_sequence_length``; 0: no bound here), and what
    #: sets it, for the error (``"T5's"``)
    max_text_tokens: int = 0
    max_text_tokens_source: str = "the text encoder's"

    @classmethod
    def load_pipeline(cls, model_path: str, dtype: torch.dtype, denoiser_only: bool) -> Any:
        """Step 1: the family's diffusers pipeline, VAE in float32 (decoding precision), the rest in ``dtype``."""
        pipe = load_family_pipeline(cls, model_path, dtype, denoiser_only)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def check_pipeline(self, pipe: Any) -> None:
        """Step 2: refuse (``ValueError``, one line) settings this family cannot run on ``pipe``; here, a
        ``max_sequence_length`` over :attr:`max_text_tokens`."""
        tokens = int(self.cfg.max_sequence_length)
        if self.max_text_tokens and tokens > self.max_text_tokens:
            raise ValueError(f"actor.model.{self.model_type}.max_sequence_length={tokens} exceeds "
                             f"{self.max_text_tokens_source} {self.max_text_tokens} tokens; use at most "
                             f"{self.max_text_tokens}")

    @classmethod
    def guidance_kind(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> str:
        """Step 3: the guidance kind in force: the recipe's, ``auto`` read as the first of ``guidance_kinds``. A
        family whose variants differ (FLUX.1-dev / schnell) reads ``configs`` (empty: decide from the recipe)."""
        return recipe_kind(cls, family_cfg) or cls.guidance_kinds[0]

    def denoiser(self, pipe: Any) -> nn.Module:
        """Step 4: the module :meth:`_predict_velocity` calls (the two-expert family wraps both experts in one)."""
        return pipe.transformer

    @classmethod
    def sample_shapes(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> SampleShapes:
        """Step 5: per-sample shapes at ``family_cfg``'s settings from the component configs, by the pipeline's
        rules (:mod:`rlrunner.models.shapes`)."""
        raise NotImplementedError(f"{cls.__name__} must define sample_shapes (build step 5)")

    def configure(self, pipe: Any) -> None:
        """Step 6: read what else the family needs from the held pipeline; nothing here."""

"""RLinf's recipe keys, translated: mapped where they mean something here, accepted where they change nothing,
refused where RLinf would compute something we do not.

:func:`translate` runs on each layer of a recipe (the composed YAML, then the command-line overrides) before it
is merged onto the schema. Keys of our schema pass unchanged (a few RLinf values are renamed, ``visual.ocr`` →
``ocr``); a key in none of the tables below also passes, so that a misspelt key still fails the schema merge with
the nearest valid key. docs/migrating.md "Coming from RLinf" has the same tables for users; keep them in step.
Table keys use ``<split>`` for ``train``/``eval`` and ``<family>`` for a model family section, as
:data:`rlrunner.config.checks.KEY_CHECKS` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlrunner.config.checks import table_key
from rlrunner.config.errors import RecipeError
from rlrunner.config.schema import AlgorithmConfig

_MISSING = object()

# RLinf keys that change nothing here: accepted, listed once in a warning
IGNORED: dict[str, str] = {
    "hydra": "Hydra's own launcher settings; the defaults list is composed by rlrunner/config/compose.py",
    "runner.task_type": "rlrunner runs diffusion recipes only",
    "runner.ckpt_path": "null in RLinf's recipes; resume with runner.resume_dir",
    "algorithm.kl_penalty": "read only with kl_beta > 0 (refused below)",
    "algorithm.kl_penalty_type": "read only with kl_beta > 0 (refused below)",
    "algorithm.reward_type": "the advantage's shape follows algorithm.adv_type (grpo: per image, grpo_video: per chunk)",
    "algorithm.logprob_type": "NFT uses no log-probabilities",
    "algorithm.entropy_type": "NFT uses no entropy",
    "algorithm.clip_ratio_high": "PPO ratio clip, not read by NFT (FlowGRPO: algorithm.flow_grpo_clip_range)",
    "algorithm.clip_ratio_low": "PPO ratio clip, not read by NFT (FlowGRPO: algorithm.flow_grpo_clip_range)",
    "algorithm.clip_ratio_c": "PPO dual clip, not read by NFT",
    "algorithm.gamma": "no returns: one-step episodes with group advantages",
    "algorithm.gae_lambda": "no GAE: group advantages",
    "algorithm.dpo_beta": "read only with nft_loss_form dpo (refused below)",
    "env.group_name": "Ray worker-group name; rlrunner names its workers itself",
    "env.<split>.env_type": "always diffusion here",
    "env.<split>.seed": "prompt order and noise derive from runner.seed and actor.seed",
    "env.<split>.auto_reset": "one-step episodes",
    "env.<split>.ignore_terminations": "one-step episodes",
    "env.<split>.max_episode_steps": "one-step episodes",
    "env.<split>.max_steps_per_rollout_epoch": "the reward's chunks follow num_frames and reward.frame_interval",
    "env.<split>.is_eval": "the section (env.train or env.eval) says it",
    "env.<split>.video_cfg.info_on_video": "no text is drawn on saved videos",
    "rollout.group_name": "Ray worker-group name",
    "rollout.recompute_logprobs": "NFT uses no log-probabilities",
    "rollout.collect_prev_infos": "the rollout returns what the update needs",
    "rollout.collect_final_values": "no value function",
    "rollout.pipeline_stage_num": "rollout is not pipelined; speed only",
    "rollout.model.precision": "the rollout uses actor.model.precision",
    "actor.group_name": "Ray worker-group name",
    "actor.training_backend": "torch DDP/FSDP2 (actor.strategy); RLinf's diffusion recipes say fsdp",
    "actor.model.load_to_device": "models load on their worker's device",
    "actor.model.num_action_chunks": "the chunks follow num_frames and reward.frame_interval",
    "actor.model.action_dim": "no actions: images and videos",
    "actor.model.is_lora": "actor.model.<family>.use_lora decides",
    "actor.model.lora_rank": "actor.model.<family>.lora_rank decides",
    "actor.model.<family>.rl_mode": "algorithm.name decides (nft by default)",
    "actor.model.<family>.timestep_fraction": "keeps rollout states for training; NFT trains on the final x0",
    "actor.model.<family>.noise_level": "SDE noise of RLinf's sampler; the NFT rollout is an ODE",
    "actor.model.<family>.eval_noise_level": "eval sampling is an ODE",
    "actor.model.<family>.output_type": "decoding is the env worker's",
    "actor.model.<family>.vidar_path": "Vidar (robot) models only",
    "actor.model.<family>.compile_transformer_forward": "torch.compile is not used; speed only",
    "actor.model.<family>.compile_mode": "torch.compile is not used; speed only",
    "actor.model.<family>.max_generation_batch_size": "memory only",
    "actor.optim.value_lr": "no critic",
    "actor.optim.critic_warmup_steps": "no critic",
    **{f"actor.fsdp_config.{key}": "speed or memory only" for key in (
        "use_orig_params", "gradient_checkpointing_use_reentrant", "enable_gradient_accumulation",
        "reshard_after_forward", "cpu_offload", "offload_pin_memory", "forward_prefetch", "limit_all_gathers",
        "backward_prefetch", "use_liger_kernel")},
    "actor.fsdp_config.mixed_precision.reduce_dtype": "gradients reduce in the LoRA weights' fp32",
    "actor.fsdp_config.mixed_precision.buffer_dtype": "buffers follow actor.model.precision",
    "weight_syncer": "the LoRA adapter (only) is sent to the rollout workers through Ray",
}

# RLinf keys accepted only with the value that does what rlrunner does: key -> (accepted values, what we support)
FIXED: dict[str, tuple[tuple[Any, ...], str]] = {
    "runner.only_eval": ((False,), "training runs; evaluation runs every runner.val_check_interval steps"),
    "algorithm.normalize_advantages": ((False,), "group advantages (algorithm.advantage_mode) only"),
    "algorithm.reward_coef": ((1, 1.0), "unscaled rewards (weight parts with env.<split>.reward.weight)"),
    "algorithm.update_epoch": ((1,), "one pass over each rollout batch"),
    "algorithm.loss_agg_func": (("token-mean",), "the mean of per-sample NFT energies"),
    "algorithm.kl_beta": ((0, 0.0), "no KL penalty (an anchor to the base model: algorithm.ref_kl_coef)"),
    "algorithm.entropy_bonus": ((0, 0.0), "no entropy bonus"),
    "algorithm.filter_rewards": ((False,), "every group trains"),
    "algorithm.nft_loss_form": (("mse",), "the MSE form of the NFT loss"),
    "algorithm.nft_weight_scale": ((1, 1.0), "unscaled weights (algorithm.nft_weight_mode)"),
    "algorithm.recompute_v": ((False,), "v_old from the EMA adapter at training time, no recomputed rollout v"),
    "algorithm.nft_gather_type": (("action_level",), "one loss term per sample (per chunk for video)"),
    "algorithm.nft_energy_reduction": (("mean",), "the mean over latent elements"),
    "rollout.generation_backend": (("huggingface",), "diffusers pipelines"),
    "actor.model.<family>.weight_format": (("diffusers",), "diffusers model folders"),
    "actor.fsdp_config.amp_autocast.enabled": ((False,), "precision from actor.model.precision, no autocast"),
    "actor.fsdp_config.amp_autocast.precision": (("bf16", "fp16"), "precision from actor.model.precision"),
    "actor.fsdp_config.grad_scaler.enabled": ((False,), "no gradient scaler (LoRA weights train in fp32)"),
    "reward.use_reward_model": ((False,), "rewards computed by the env workers (env.<split>.reward)"),
    "critic.use_critic_model": ((False,), "no critic"),
}

# RLinf values of our own keys
VALUES: dict[str, dict[Any, Any]] = {
    "env.<split>.dataset.type": {"visual.ocr_dataset": "ocr"},
    "env.<split>.reward.model": {"visual.ocr": "ocr", "visual.video_ocr": "video_ocr"},
    "actor.model.<family>.eval_sampler": {"ode": "euler"},
    "actor.model.<family>.train_sampler": {"ode": "euler"},
    "actor.model.<family>.lora_path": {None: ""},
    "runner.resume_dir": {None: ""},
}

PRECISIONS = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "fp32": "fp32",
              "float32": "fp32"}

Lookup = Callable[[str], Any]  # resolved value of a dotted key (this layer first, then the recipe under it)
Moves = list[tuple[str, Any]]


def _strategy(key: str, value: Any, get: Lookup) -> Moves:
    # RLinf's fsdp/fsdp2 shard the model unless sharding_strategy is no_shard; torch's FSDP2 does that here
    sharding = get("actor.fsdp_config.sharding_strategy")
    if value not in ("fsdp", "fsdp2"):
        raise RecipeError(f"{key}={value!r}: rlrunner's actor runs fsdp2 or ddp (actor.strategy); use fsdp or fsdp2")
    return [("actor.strategy", "ddp" if sharding == "no_shard" else "fsdp2")]


def _sharding(key: str, value: Any, get: Lookup) -> Moves:
    if value not in ("full_shard", "no_shard", None):
        raise RecipeError(f"{key}={value!r}: rlrunner shards fully (fsdp2) or not at all (ddp); use full_shard or "
                          "no_shard")
    strategy = get("actor.fsdp_config.strategy")
    return [("actor.strategy", "ddp" if value == "no_shard" else "fsdp2")] if strategy is _MISSING else []


def _family_key(get: Lookup, leaf: str) -> str:
    model_type = get("actor.model.model_type")
    if model_type is _MISSING:
        raise RecipeError(f"an RLinf key sets actor.model.<family>.{leaf} but actor.model.model_type is not set; set "
                          "it (e.g. actor.model.model_type=sd3)")
    return f"actor.model.{model_type}.{leaf}"


def _checkpointing(key: str, value: Any, get: Lookup) -> Moves:
    return [(_family_key(get, "gradient_checkpointing"), bool(value))]


def _param_dtype(key: str, value: Any, get: Lookup) -> Moves:
    if value is None:
        return []
    if value not in PRECISIONS:
        raise RecipeError(f"{key}={value!r} is not a precision; use one of {sorted(PRECISIONS)}")
    return [("actor.model.precision", PRECISIONS[value])]


def _offload(key: str, value: Any, get: Lookup) -> Moves:
    # collocated components move idle models to host memory: one switch here for RLinf's three
    return [("cluster.enable_offload", True)] if value else []


def _auxiliary(key: str, value: Any, get: Lookup) -> Moves:
    family = key.rsplit(".", 1)[0]
    return [(f"{family}.offload_text_encoder", bool(value)), (f"{family}.offload_vae", bool(value))]


def _loss_type(key: str, value: Any, get: Lookup) -> Moves:
    if value != "embodied_nft":
        raise RecipeError(f"{key}={value!r}: RLinf's diffusion loss here is embodied_nft (DiffusionNFT); other "
                          "objectives are algorithm.name=flow_grpo or awm")
    return [("algorithm.name", "nft")]


def _cfg(key: str, value: Any, get: Lookup) -> Moves:
    # RLinf switches CFG with cfg; rlrunner applies it whenever guidance_scale > 1
    family = key.rsplit(".", 1)[0]
    scale = get(f"{family}.guidance_scale")
    scale = 1.0 if scale is _MISSING else scale
    if bool(value) != (scale > 1):
        raise RecipeError(f"{key}={value!r} with {family}.guidance_scale={scale}: rlrunner applies classifier-free "
                          f"guidance exactly when guidance_scale > 1; set guidance_scale "
                          f"{'> 1' if value else '= 1'} or drop cfg")
    return []


def _rollout_model(key: str, value: Any, get: Lookup) -> Moves:
    actor = get("actor.model.model_path")
    if actor is not _MISSING and value != actor:
        raise RecipeError(f"{key}={value!r} differs from actor.model.model_path={actor!r}: rlrunner rolls out with "
                          "the actor's model; drop rollout.model.model_path")
    return []


def _group_size(key: str, value: Any, get: Lookup) -> Moves:
    # algorithm.group_size sets the training group; eval samples each held-out prompt once
    if key.startswith("env.eval."):
        expected, why = 1, "rlrunner's eval samples each held-out prompt once"
    else:
        expected = get("algorithm.group_size")
        expected = AlgorithmConfig.group_size if expected is _MISSING else expected
        why = f"algorithm.group_size={expected!r} sets the group"
    if value != expected:
        raise RecipeError(f"{key}={value!r} differs from what it means here ({why}); set {key}={expected!r} or "
                          f"drop it")
    return []


# RLinf keys that set our keys: key -> function(key, resolved value, lookup) -> [(our key, value)]
MAPPED: dict[str, Callable[[str, Any, Lookup], Moves]] = {
    "actor.fsdp_config.strategy": _strategy,
    "actor.fsdp_config.sharding_strategy": _sharding,
    "actor.fsdp_config.gradient_checkpointing": _checkpointing,
    "actor.fsdp_config.mixed_precision.param_dtype": _param_dtype,
    "actor.enable_offload": _offload,
    "rollout.enable_offload": _offload,
    "env.enable_offload": _offload,
    "actor.model.<family>.offload_auxiliary_modules": _auxiliary,
    "actor.model.<family>.cfg": _cfg,
    "algorithm.loss_type": _loss_type,
    "rollout.model.model_path": _rollout_model,
    "env.<split>.group_size": _group_size,
}


def _leaves(node: Any, schema: DictConfig, prefix: str = ""):
    """``(dotted key, raw value)`` of a layer, not walking into our dict-valued keys (component_placement)."""
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        declared = OmegaConf.select(schema, dotted, default=_MISSING)
        section = isinstance(declared, DictConfig) and OmegaConf.get_type(declared) not in (None, dict)
        if isinstance(value, dict) and value and (declared is _MISSING or section):
            yield from _leaves(value, schema, f"{dotted}.")
        else:
            yield dotted, value


def _ignored_prefix(tkey: str) -> str | None:
    """The IGNORED entry covering ``tkey``: itself or a section above it (``weight_syncer``, ``hydra``)."""
    parts = tkey.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in IGNORED), None)


def translate(layer: DictConfig, schema: DictConfig, families: list[str], under: DictConfig | None = None,
              source: str = "recipe") -> tuple[DictConfig, list[str]]:
    """``layer`` in rlrunner's keys, and the table keys of the RLinf keys it dropped as changing nothing.

    ``under``: the (translated) recipe below an override layer, where keys the layer lacks are looked up.
    """

    def get(dotted: str) -> Any:
        for node in (layer, under):
            if node is None:
                continue
            try:
                value = OmegaConf.select(node, dotted, default=_MISSING)
            except OmegaConfBaseException:
                continue  # an interpolation into a key this layer lacks
            if value is not _MISSING:
                return OmegaConf.to_container(value) if isinstance(value, DictConfig) else value
        return _MISSING

    out: dict[str, Any] = {}
    ignored: list[str] = []
    moves: Moves = []
    for dotted, raw in _leaves(OmegaConf.to_container(layer, resolve=False), schema):
        tkey = table_key(dotted, families)
        if OmegaConf.select(schema, dotted, default=_MISSING) is not _MISSING:
            value = get(dotted) if tkey in VALUES else raw
            out[dotted] = VALUES.get(tkey, {}).get(value, raw) if _hashable(value) else raw
        elif tkey in MAPPED:
            moves += MAPPED[tkey](dotted, get(dotted), get)
        elif tkey in FIXED:
            accepted, supported = FIXED[tkey]
            value = get(dotted)
            if value not in accepted:
                raise RecipeError(f"{source}: {dotted}={value!r} is an RLinf setting rlrunner does not implement; "
                                  f"it supports {' or '.join(repr(a) for a in accepted[:1])} ({supported})")
            ignored.append(tkey)
        elif (covered := _ignored_prefix(tkey)) is not None:
            ignored.append(covered)
        else:
            out[dotted] = raw  # unknown: the schema merge names it and the nearest valid key
    for dotted, value in moves:
        out.setdefault(dotted, value)  # a key the layer sets itself wins over a mapped RLinf key
    merged = OmegaConf.create({})
    for dotted, value in out.items():
        OmegaConf.update(merged, dotted, value, merge=False, force_add=True)
    return merged, list(dict.fromkeys(ignored))


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True

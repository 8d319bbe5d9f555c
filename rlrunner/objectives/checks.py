"""The checks of the ``algorithm.*`` keys, and across keys: the advantage mode of the advantage estimator, the
rollout states NFT trains on, FlowGRPO's sampler, guidance and SDE window, and AWM's sampler band. Registered in
:mod:`rlrunner.recipe`."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, ListConfig

from rlrunner.algorithms.advantages import ADVANTAGE_ESTIMATORS
from rlrunner.algorithms.awm_loss import WEIGHTINGS
from rlrunner.algorithms.ema import DECAY_SCHEDULES
from rlrunner.algorithms.nft_loss import ADV_MODES, TARGET_SPACES, WEIGHT_MODES
from rlrunner.algorithms.samplers import TRAIN_TIMESTEPS
from rlrunner.config.check_kinds import POSITIVE_INT, Check, Choice, Context, Elsewhere, Range, Rule, fixed, names
from rlrunner.config.errors import fail as _fail
from rlrunner.objectives import OBJECTIVES
from rlrunner.objectives.awm import TIMESTEPS
from rlrunner.objectives.nft import XCUR_SOURCES


def is_tau(spec: Any) -> bool:
    """``algorithm.nft_tau``: a number in (0, 1] or [start, end, start_step, end_step] with start_step <= end_step."""
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if number(spec):
        return 0 < spec <= 1
    return (isinstance(spec, (list, tuple, ListConfig)) and len(spec) == 4 and all(number(x) for x in spec)
            and 0 <= spec[0] <= 1 and 0 <= spec[1] <= 1 and 0 <= spec[2] <= spec[3])


TAU_ALLOWED = "a number in (0, 1] or [start, end, start_step, end_step] with 0 <= start_step <= end_step, e.g. " \
              "[1.0, 0.01, 30, 70]"


KEY_CHECKS: dict[str, Check] = {
    "algorithm.name": Choice(names(OBJECTIVES)),
    "algorithm.group_size": Range(low=2, meaning="group-relative advantages need 2 or more samples per prompt"),
    "algorithm.adv_type": Choice(names(ADVANTAGE_ESTIMATORS)),
    "algorithm.advantage_mode": Elsewhere("check_algorithm (the modes of algorithm.adv_type)"),
    "algorithm.adv_clip_max": Range(low=0, low_open=True),
    "algorithm.nft_beta": Range(low=0, low_open=True),
    "algorithm.nft_target_space": Choice(names(TARGET_SPACES)),
    "algorithm.nft_weight_mode": Choice(names(WEIGHT_MODES)),
    "algorithm.nft_clip_ratio": Range(low=0, low_open=True, optional=True, meaning="null = no clipping"),
    "algorithm.nft_tau": Rule(is_tau, TAU_ALLOWED),
    "algorithm.nft_decay_type": Choice(names(DECAY_SCHEDULES, first=("",))),
    "algorithm.nft_xcur_source": Choice(names(XCUR_SOURCES)),
    "algorithm.nft_train_timesteps": Choice(names(TRAIN_TIMESTEPS)),
    # and <= num_steps with nft_xcur_source rollout (check_algorithm)
    "algorithm.nft_timesteps_per_sample": POSITIVE_INT,
    "algorithm.ref_kl_coef": Range(low=0, meaning="0 = no KL anchor"),
    "algorithm.reward_signal": Choice(fixed("reward", "none", "shuffle")),  # Runner.advantages
    "algorithm.flow_grpo_noise_level": Range(low=0, low_open=True, meaning="the SDE's noise level a"),
    "algorithm.flow_grpo_clip_range": Range(low=0, low_open=True),
    "algorithm.flow_grpo_timestep_fraction": Range(low=0, high=1, low_open=True, meaning="share of SDE steps trained"),
    "algorithm.flow_grpo_sde_window_size": Range(low=0, meaning="0 = every step is an SDE step"),
    "algorithm.flow_grpo_sde_window_range": Rule(
        lambda r: r is None or (isinstance(r, (list, tuple, ListConfig)) and len(r) == 2
                                and all(isinstance(x, int) and not isinstance(x, bool) for x in r) and 0 <= r[0] < r[1]),
        "null or [first, end] steps with 0 <= first < end (within num_steps: validate._check_flow_grpo)"),
    "algorithm.awm_weighting": Choice(names(WEIGHTINGS)),
    "algorithm.awm_ghuber_power": Range(low=0, low_open=True),
    "algorithm.awm_timesteps": Choice(names(TIMESTEPS)),
    "algorithm.awm_timestep_fraction": Range(low=0, high=1, low_open=True,
                                             meaning="the share of the sampler's steps trained on"),
    "algorithm.awm_timesteps_per_sample": POSITIVE_INT,
    "algorithm.awm_ema_kl_coef": Range(low=0, meaning="0 = no EMA anchor"),
    "algorithm.nft_adv_mode": Choice(names(ADV_MODES)),
}


def check_algorithm(cfg: DictConfig, ctx: Context) -> None:
    alg = cfg.algorithm
    valid = ADVANTAGE_ESTIMATORS[alg.adv_type].modes
    if alg.advantage_mode not in valid:
        _fail(f"algorithm.advantage_mode={alg.advantage_mode!r} is not valid for algorithm.adv_type={alg.adv_type!r}; "
              f"choose one of {list(valid)}")
    num_steps = cfg.actor.model[cfg.actor.model.model_type].num_steps
    if alg.nft_xcur_source == "rollout" and alg.nft_timesteps_per_sample > num_steps:
        _fail(f"algorithm.nft_timesteps_per_sample={alg.nft_timesteps_per_sample} exceeds the {num_steps} rollout "
              f"states of a sample (actor.model.{cfg.actor.model.model_type}.num_steps) that "
              f"algorithm.nft_xcur_source=rollout trains on; use at most {num_steps}")
    if cfg.runner.max_steps <= 0 and cfg.runner.max_epochs <= 0:
        _fail("set runner.max_steps or runner.max_epochs to a positive number")


def check_flow_grpo(cfg: DictConfig, ctx: Context) -> None:
    """flow_grpo's rollout is its own Euler(-Maruyama) integrator without classifier-free guidance (the recipe's,
    resolved from its model folder: ``ctx.resolved["guidance"]``, after the model's checks), with one advantage per
    sample, and its SDE window lies within the sampling steps."""
    alg = cfg.algorithm
    if alg.name != "flow_grpo":
        return
    from rlrunner.algorithms.flow_grpo_loss import window_range  # torch: imported only for a flow_grpo recipe

    key = f"actor.model.{cfg.actor.model.model_type}"
    family = cfg.actor.model[cfg.actor.model.model_type]
    if family.train_sampler != "euler":
        _fail(f"{key}.train_sampler={family.train_sampler!r} but algorithm.name=flow_grpo samples with Euler(-Maruyama) "
              f"steps (SDE on the trained steps, Euler elsewhere); set {key}.train_sampler=euler")
    if ctx.resolved["guidance"].passes > 1:
        _fail(f"{key}.guidance_scale={family.guidance_scale} but algorithm.name=flow_grpo trains without classifier-free "
              f"guidance (its loss recomputes the sampled step's unguided log-probability); set {key}.guidance_scale=1")
    if alg.adv_type != "grpo":
        _fail(f"algorithm.adv_type={alg.adv_type!r} but algorithm.name=flow_grpo takes one advantage per sample; use "
              f"algorithm.adv_type=grpo")
    size, steps = alg.flow_grpo_sde_window_size, family.num_steps
    low, high = window_range(alg.flow_grpo_sde_window_range, steps)
    if size > 0 and not (high <= steps and size <= high - low):
        _fail(f"algorithm.flow_grpo_sde_window_size={size} in algorithm.flow_grpo_sde_window_range=[{low}, {high}] does "
              f"not fit {key}.num_steps={steps}; the window of steps must lie within [0, {steps}] (null: the first half)")


def check_awm(cfg: DictConfig, ctx: Context) -> None:
    """AWM's sampler band (rlrunner.algorithms.awm_loss.awm_band_index) holds at least one noise level below 1."""
    alg = cfg.algorithm
    if alg.name != "awm" or alg.awm_timesteps != "sampler":
        return
    family_key = f"actor.model.{cfg.actor.model.model_type}"
    steps = cfg.actor.model[cfg.actor.model.model_type].num_steps
    if steps < 2 or int(steps * alg.awm_timestep_fraction) < 1:
        _fail(f"algorithm.awm_timesteps=sampler trains on the sampler's sigmas 1 <= k < int({family_key}.num_steps x "
              f"algorithm.awm_timestep_fraction) = int({steps} x {alg.awm_timestep_fraction}); use num_steps >= 2 "
              f"and a fraction >= 1/num_steps, or algorithm.awm_timesteps=uniform")

"""Pure tensor math of the algorithms: the losses of DiffusionNFT, AWM and FlowGRPO (``*_loss.py``; how a worker
trains with each is :mod:`rlrunner.objectives`), advantages, EMA schedules, flow samplers and the reward-hacking
watch's diversity measure and alarm rule (imports only torch).

May import: nothing of rlrunner
"""

from rlrunner.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    get_advantage_estimator,
    group_advantages,
    video_group_advantages,
)
from rlrunner.algorithms.ema import DECAY_SCHEDULES, decay_at, ema_update_, tau_at
from rlrunner.algorithms.nft_loss import nft_loss, nft_velocities
from rlrunner.algorithms.samplers import SAMPLERS, sample_flow, sample_xt, sigma_schedule, training_timesteps

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DECAY_SCHEDULES",
    "SAMPLERS",
    "decay_at",
    "ema_update_",
    "get_advantage_estimator",
    "group_advantages",
    "nft_loss",
    "nft_velocities",
    "sample_flow",
    "sample_xt",
    "sigma_schedule",
    "tau_at",
    "training_timesteps",
    "video_group_advantages",
]

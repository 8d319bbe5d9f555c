"""CPU threads the OCR reward gets per env worker, as the plan prints them, and the warning when they are too few.

OCR on the CPU (rapidocr, PaddleOCR; also ``use_gpu: true`` without a CUDA onnxruntime, which falls back to it)
scores a rollout round on the env workers' threads; with ``cluster.env_threads: reserved`` they are the worker's
``cluster.cpus_per_worker`` (1 by default: 8 threads score for a whole 8-GPU node). ``cluster.env_threads: node``
sizes them from each node's CPUs when the run starts, which the plan cannot see offline, so it names the rule
instead of a number.
"""

from __future__ import annotations

from typing import Any

from rlrunner.sizing.memory import OCR_REWARDS

MIN_OCR_THREADS = 4  # fewer CPU threads per env worker and CPU OCR, not the GPUs, sets the step time


def ocr_rewards(env_cfg: Any) -> list[str]:
    """``env.<split>.reward`` of each split whose reward (or a part of its multi reward) is an OCR reward (GPU OCR
    included: it runs on the CPU where onnxruntime has no CUDA provider)."""
    from rlrunner.rewards import reward_config
    from rlrunner.rewards.registry import part_config

    found = []
    for split in ("train", "eval"):
        cfg = reward_config(env_cfg[split].reward)
        specs = [part_config(cfg, p) for p in cfg.rewards] if cfg.type == "multi" else [cfg]
        if any(spec.model in OCR_REWARDS for spec in specs):
            found.append(f"env.{split}.reward")
    return found


def ocr_thread_lines(cluster_cfg: Any, env_cfg: Any) -> tuple[list[str], list[str]]:
    """The plan's line on the OCR reward's CPU threads per env worker (none without OCR), and a ``WARNING:``
    line when a reservation gives it fewer than :data:`MIN_OCR_THREADS`."""
    rewards = ocr_rewards(env_cfg)
    if not rewards:
        return [], []
    where = " and ".join(rewards)
    if cluster_cfg.env_threads == "node":
        line = (f"OCR ({where}): CPU threads per env worker = the CPUs its node's other workers leave, shared by "
                f"the env workers there (cluster.env_threads=node; sized at launch)")
        return [line], []
    threads = max(1, int(cluster_cfg.cpus_per_worker))
    line = (f"OCR ({where}): {threads} CPU thread(s) per env worker (cluster.cpus_per_worker="
            f"{cluster_cfg.cpus_per_worker:g}, cluster.env_threads=reserved)")
    if threads >= MIN_OCR_THREADS:
        return [line], []
    warning = (f"WARNING: OCR ({where}) gets {threads} CPU thread(s) per env worker, fewer than {MIN_OCR_THREADS}; "
               f"set cluster.env_threads=node (the node's CPUs that the other workers leave, shared by its env "
               f"workers) or cluster.cpus_per_worker={MIN_OCR_THREADS}")
    return [line], [warning]

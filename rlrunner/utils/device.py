"""Accelerator-agnostic device and precision helpers (CUDA, Ascend NPU via torch-npu, CPU)."""

from __future__ import annotations

import importlib.util

import torch

DEVICE_NAMES = ("auto", "cpu", "cuda", "npu")
PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch_npu  # noqa: F401  (registers torch.npu)

    return torch.npu.is_available()


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` picks cuda, then npu, then cpu; an explicit name must be available."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("npu") if npu_available() else torch.device("cpu")
    if name not in DEVICE_NAMES:
        raise ValueError(f"unknown device {name!r}; valid: {', '.join(DEVICE_NAMES)}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA GPU; use device: auto or cpu")
    if name == "npu" and not npu_available():
        raise ValueError("device 'npu' was asked for but torch-npu is not installed (requirements/npu.txt)")
    return torch.device(name)


def resolve_dtype(precision: str, device: torch.device, half_on_cpu: bool = False) -> torch.dtype:
    """Training dtype for ``precision``; half precisions fall back to fp32 on CPU, where they are slow, unless
    ``half_on_cpu`` (``actor.model.half_precision_on_cpu``: a CPU run that catches dtype mistakes)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {sorted(PRECISIONS)}")
    return torch.float32 if device.type == "cpu" and not half_on_cpu else PRECISIONS[precision]

"""Accelerator-agnostic device and precision helpers (CUDA, Ascend NPU via torch-npu, CPU)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, MutableMapping

import torch

DEVICE_NAMES = ("auto", "cpu", "cuda", "npu")
PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Ray resource -> (torch device kind, the variable that makes Ray leave the visible devices alone, the variable that
# lists them): with RAY_EXPERIMENTAL_NOSET_*=1 (common on verl / OpenRLHF clusters) every worker sees all devices
RAY_ACCELERATORS = {"GPU": ("cuda", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
                    "NPU": ("npu", "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")}
# set by the cluster for a worker whose device is not device 0 of what it sees (see ray_device_index)
DEVICE_INDEX_ENV = "RLRUNNER_DEVICE_INDEX"


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


def precision_fallback_note(precision: str, half_on_cpu: bool, devices: Mapping[str, str]) -> str | None:
    """One line for the start of a run whose model asks for a half precision that its workers cannot have: the
    workers that found no accelerator compute in fp32 on the CPU (:func:`resolve_dtype`); None when all is as asked.

    ``devices``: each model-holding component's device as its workers report it (``{"actor": "cpu", ...}``).
    """
    on_cpu = sorted(role for role, device in devices.items() if device == "cpu")
    if precision == "fp32" or half_on_cpu or not on_cpu:
        return None
    return (f"rlrunner: actor.model.precision is {precision} but the {' and '.join(on_cpu)} worker(s) found no "
            f"accelerator (torch {torch.__version__} sees no CUDA or NPU device): they compute in fp32 on the CPU "
            "instead; for a GPU install a CUDA build of torch (docs/install.md), and set actor.model.device: cuda to "
            "make a missing GPU an error, or actor.model.precision: fp32 to run on the CPU as intended")


def ray_device_index(accelerator_ids: Mapping[str, list[str]], environ: Mapping[str, str]) -> tuple[str, int] | None:
    """The torch device (kind, index) of the accelerator Ray assigned to this worker, where Ray left the visible
    devices alone (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` set, as Ray reads it: any non-empty value); None
    when Ray narrowed them to the worker's own, which torch then numbers 0, or when it assigned none.

    ``accelerator_ids``: ``ray.get_runtime_context().get_accelerator_ids()`` (``{"GPU": ["3"], ...}``), ids as the
    node numbers them: indices into ``CUDA_VISIBLE_DEVICES`` when that is set, else physical indices.
    """
    for resource, (kind, noset, visible_var) in RAY_ACCELERATORS.items():
        ids = accelerator_ids.get(resource) or []
        if not ids or not environ.get(noset):
            continue
        visible = [v.strip() for v in environ.get(visible_var, "").split(",") if v.strip()]
        if not visible:
            return kind, int(ids[0])
        if ids[0] not in visible:
            raise RuntimeError(f"Ray assigned {resource} {ids[0]} but {visible_var}={environ[visible_var]!r} does not "
                               f"list it ({noset} is set); start the Ray node with the same {visible_var}")
        return kind, visible.index(ids[0])
    return None


def use_ray_assigned_device(accelerator_ids: Mapping[str, list[str]], environ: MutableMapping[str, str]) -> None:
    """Make the accelerator Ray assigned this worker its current device (:func:`ray_device_index`), and record the
    index in ``environ`` (:data:`DEVICE_INDEX_ENV`) for :func:`rlrunner.distributed.process_group.init_distributed`;
    nothing to do when Ray narrowed the visible devices (the worker's own is device 0)."""
    assigned = ray_device_index(accelerator_ids, environ)
    if assigned is None:
        return
    kind, index = assigned
    if kind == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu)
    getattr(torch, kind).set_device(index)
    environ[DEVICE_INDEX_ENV] = str(index)

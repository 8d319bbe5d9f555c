"""What each component holds on its device, in bytes, for a recipe and a model folder's configs.

The layout is the one the workers keep (after issue 14's data plane):

* **actor** (one rank per actor device): denoiser base weights (sharded over the actor ranks with
  ``actor.strategy: fsdp2``, which shards every block parameter, LoRA and optimizer state included), the
  ``default`` and ``ema`` LoRA adapters in fp32, the ``default`` adapter's gradients and AdamW state
  (``exp_avg`` and ``exp_avg_sq``, fp32), and one micro-batch of inputs; no text encoders, no VAE.
* **rollout** (one worker per rollout device): a full denoiser replica with both adapters, the text encoders,
  the VAE (fp32), and the tensors of one ``generate`` call (noise, x0, conditioning per sample).
* **env**: the reward models (``Reward.device_memory``: the CLIP-family scorers' weights in ``reward.precision``);
  the OCR engine is not counted (PaddleOCR on a GPU holds a few hundred MB).

Activation memory is a formula (:mod:`rlrunner.sizing.activations`), not a measurement.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from rlrunner.models import model_class
from rlrunner.models.guidance import Guidance
from rlrunner.models.meta import ModelFolderError, build_on_meta, lora_parameter_count, module_bytes, read_components
from rlrunner.models.shapes import ActivationProfile, SampleShapes
from rlrunner.objectives import build_objective
from rlrunner.sizing.activations import activation_bytes, decode_bytes, tokens_per_rank
from rlrunner.sizing.measured_activations import MEASURED_ACTIVATIONS
from rlrunner.step.sizes import StepSizes
from rlrunner.utils.device import PRECISIONS, resolve_dtype
from rlrunner.utils.flat_state import sync_buffer_bytes

DENOISER_NAMES = ("transformer", "unet")
VAE_NAME = "vae"
#: AdamW keeps two fp32 tensors per trainable parameter (exp_avg, exp_avg_sq)
ADAMW_STATES = 2
#: rewards whose OCR engine the plan does not size
OCR_REWARDS = ("ocr", "video_ocr")
FP32 = torch.float32
#: denoiser config keys whose sum is the block count L: FLUX's single-stream blocks see every token as its double
#: blocks do; Z-Image's n_refiner_layers refine the image and the text tokens apart, about one block over both each
BLOCK_COUNT_KEYS = ("num_layers", "num_single_layers", "n_layers", "n_refiner_layers")


def nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.50 KiB"`` (binary units)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def format_count(n: int) -> str:
    """``2_243_000_000`` -> ``"2.24 B"``; ``18_800_000`` -> ``"18.8 M"``."""
    for unit, size, digits in (("B", 1e9, 2), ("M", 1e6, 1), ("k", 1e3, 1)):
        if n >= size:
            return f"{n / size:.{digits}f} {unit}"
    return str(n)


@dataclass(frozen=True)
class ModelSizes:
    """Bytes of a model folder's parts at a recipe's precision, and the per-sample shapes of its family."""

    dtype: torch.dtype
    denoiser_bytes: int
    denoiser_params: int
    text_encoder_bytes: dict[str, int]
    vae_bytes: int
    lora_params: int  # one adapter
    shapes: SampleShapes
    hidden_size: int | None  # transformer width h (None: not a transformer, e.g. the tiny UNet)
    num_layers: int | None  # blocks of one denoiser (each sample runs through one expert's)
    experts: int = 1  # denoisers routed by sigma (Wan2.2 A14B: 2), all held on the device
    guidance: Guidance | None = None  # the recipe's guidance on this folder (FlowModel.resolve_guidance)
    profile: ActivationProfile = field(default_factory=ActivationProfile)  # the family's activation constants
    largest_block_bytes: int = 0  # the denoiser's largest block (FSDP2's unit of all-gather); 0: no blocks named
    non_block_bytes: int = 0  # what no block holds (embeddings, output layers: FSDP2's root units), every expert
    decode_batch_size: int = 8  # samples per VAE decode call (the family's)

    def cond_bytes(self, rows: int) -> int:
        """Conditioning of ``rows`` samples (or prompts): every tensor of :attr:`SampleShapes.cond`."""
        return sum(nbytes((rows, *shape), dtype or self.dtype) for shape, dtype in self.shapes.cond.values())

    def latent_bytes(self, rows: int) -> int:
        return nbytes((rows, *self.shapes.latent), FP32)

    def pixel_bytes(self, rows: int) -> int:
        return nbytes((rows, *self.shapes.pixels), torch.uint8)


def resolve_model_folder(model_path: str, base_dir: Path) -> Path:
    """The local folder of ``actor.model.model_path``; a hub id gets a one-line hint on fetching its configs."""
    folder = base_dir / Path(model_path).expanduser()
    if folder.is_dir():
        return folder
    if not model_path.startswith((".", "/", "~")) and model_path.count("/") == 1:
        raise ModelFolderError(
            f"actor.model.model_path={model_path!r} is a hub id; the plan reads a local folder. Fetch its configs "
            f"only (`hf download {model_path} --include '*.json'`, or copy model_index.json and each component's "
            f"config.json) and pass actor.model.model_path=<that folder>")
    raise ModelFolderError(f"actor.model.model_path={model_path!r}: model folder {folder} does not exist")


def family_profile(family: Any) -> ActivationProfile:
    """``family``'s activation constants: those its recorded full-size simulations measured
    (:data:`~rlrunner.sizing.measured_activations.MEASURED_ACTIVATIONS`, written from the record) over the structure
    it declares (``decode_chunk_frames``, ``text_in_sequence``); a family without a recorded recipe (the tiny one, a
    plugin) keeps the constants it declares."""
    measured = MEASURED_ACTIVATIONS.get(family.activations_measured_by or family.model_type, {})
    return dataclasses.replace(family.activation_profile, **measured)


def model_sizes(model_cfg: Any, folder: Path) -> ModelSizes:
    """Build every component of ``folder`` on the meta device and size it at ``model_cfg.precision``.

    The denoiser, text encoders and tiny encoders load in the recipe's precision, the VAE in fp32 (as
    :meth:`FlowModel.load` loads them); LoRA uses the family's targets and the recipe's rank/alpha.
    """
    family = model_class(model_cfg.model_type)
    family_cfg = model_cfg[model_cfg.model_type]
    index, components = read_components(folder)
    configs = {name: component.config for name, component in components.items()} | {"model_index": index}
    try:
        shapes = family.sample_shapes(family_cfg, configs)
        guidance = family.resolve_guidance(family_cfg, configs)
    except KeyError as err:
        raise ModelFolderError(f"{folder}: the component configs lack {err}; is it a {model_cfg.model_type} "
                               f"model folder (model_index.json lists {sorted(components)})?") from None
    denoiser_name = next((n for n in DENOISER_NAMES if n in components), None)
    if denoiser_name is None or VAE_NAME not in components and model_cfg.model_type != "tiny":
        raise ModelFolderError(f"{folder / 'model_index.json'} lists {sorted(components)}: no denoiser "
                               f"({' or '.join(DENOISER_NAMES)}) or no {VAE_NAME}")
    # the recipe's precision on an accelerator; a run pinned to the CPU computes in fp32 unless told otherwise
    device = torch.device("cpu" if model_cfg.device == "cpu" else "cuda")  # any accelerator: only its kind counts
    dtype = resolve_dtype(model_cfg.precision, device, model_cfg.half_precision_on_cpu)
    # a denoiser of experts (Wan2.2 A14B: transformer and transformer_2) counts all of them; LoRA goes on those the
    # recipe adapts
    names = [n for n in family.expert_components if n in components] or [denoiser_name]
    denoisers = {name: build_on_meta(components[name]) for name in names}
    config = components[denoiser_name].config
    text_encoders = {name: module_bytes(build_on_meta(c, dtype), dtype) for name, c in components.items()
                     if name not in (*names, VAE_NAME)}
    blocks = [block for d in denoisers.values() for block in _blocks(d)]
    block_bytes = [module_bytes(block, dtype) for block in blocks]
    heads, head_dim = config.get("num_attention_heads"), config.get("attention_head_dim")
    width = heads * head_dim if isinstance(heads, int) and isinstance(head_dim, int) else config.get("dim")
    layers = sum(int(config.get(key) or 0) for key in BLOCK_COUNT_KEYS) or None
    denoiser_bytes = sum(module_bytes(d, dtype) for d in denoisers.values())
    return ModelSizes(
        dtype=dtype,
        denoiser_bytes=denoiser_bytes,
        denoiser_params=sum(p.numel() for d in denoisers.values() for p in d.parameters()),
        text_encoder_bytes=text_encoders,
        vae_bytes=module_bytes(build_on_meta(components[VAE_NAME]), FP32) if VAE_NAME in components else 0,
        lora_params=sum(lora_parameter_count(d, family.lora_target_modules, int(family_cfg.lora_rank),
                                             int(family_cfg.lora_alpha), family.lora_exclude_modules(d))
                        for name, d in denoisers.items() if name in family.adapted_components(family_cfg)),
        shapes=shapes,
        hidden_size=width if isinstance(width, int) else None,
        num_layers=layers if denoiser_name == "transformer" else None,
        experts=len(denoisers),
        guidance=guidance,
        profile=family_profile(family),
        decode_batch_size=family.decode_batch_size,
        largest_block_bytes=max(block_bytes, default=0),
        non_block_bytes=denoiser_bytes - sum(block_bytes) if block_bytes else 0,
    )


def _blocks(denoiser: Any) -> list[Any]:
    """The blocks FSDP2 shards one by one (:func:`~rlrunner.distributed.parallelize.transformer_blocks`), none for a
    denoiser that names none."""
    from rlrunner.distributed.parallelize import transformer_blocks

    try:
        return transformer_blocks(denoiser)
    except ValueError:
        return []


@dataclass(frozen=True)
class StepGeometry(StepSizes):
    """The step's sizes (:class:`~rlrunner.step.sizes.StepSizes`, as the runner derives them) and what the memory
    plan reads beside them."""

    cfg_factor: int = 1  # 2 when rollouts use classifier-free guidance (negative and conditional halves)
    num_logged_samples: int = 0
    kept_latents: int = 0  # latent-sized tensors the algorithm's rollout keeps per sample besides x0


def step_geometry(cfg: Any, placement: Any, guidance: Guidance) -> StepGeometry:
    """The step's sizes for ``cfg`` on ``placement``; ``guidance`` (:attr:`ModelSizes.guidance`) says how many
    denoiser passes a rollout step runs (2 for classifier-free guidance: negative and conditional halves)."""
    sizes = StepSizes.of(cfg, placement)
    family = cfg.actor.model[cfg.actor.model.model_type]
    return StepGeometry(**{f.name: getattr(sizes, f.name) for f in fields(StepSizes)}, cfg_factor=guidance.passes,
                        num_logged_samples=min(cfg.runner.num_logged_samples, sizes.samples),
                        kept_latents=build_objective(cfg.algorithm, family, guidance).kept_latents_per_sample())


@dataclass(frozen=True)
class Part:
    """One item a component holds on its device.

    ``counted``: on the device at all (False for what waits in host memory); ``transient``: only while its
    component runs (gradients, batches); ``swapped``: moves to host memory while the other collocated model
    runs (``cluster.enable_offload``); ``step``: a transient part held only in that step of its component, which
    does not overlap the component's activations (the actor's weight-sync buffer: after the update).
    """

    component: str
    name: str
    nbytes: int
    detail: str = ""
    counted: bool = True
    transient: bool = False
    swapped: bool = False
    step: str = ""


@dataclass
class ComponentPlan:
    parts: list[Part] = field(default_factory=list)
    activation_bytes: int | None = None  # None: no estimate for this denoiser
    activation_detail: str = ""

    @property
    def resident_bytes(self) -> int:
        return sum(p.nbytes for p in self.parts if p.counted)

    def working_bytes(self) -> int:
        """What the component adds while it runs: its transient parts of every step, plus the larger of its
        activations and the parts of any other step of its own (:attr:`Part.step`)."""
        transient = [p for p in self.parts if p.counted and p.transient]
        steps = {p.step for p in transient if p.step}
        alone = [sum(p.nbytes for p in transient if p.step == step) for step in steps]
        return sum(p.nbytes for p in transient if not p.step) + max([self.activation_bytes or 0, *alone])


def actor_plan(sizes: ModelSizes, geometry: StepGeometry, strategy: str, checkpointing: bool) -> ComponentPlan:
    """One actor rank: denoiser + 2 adapters + gradients + AdamW state + one micro-batch (no text encoders, no VAE)."""
    shards = geometry.actor_ranks if strategy == "fsdp2" else 1
    per_rank = f" / {shards} ranks (fsdp2)" if shards > 1 else ""
    lora = sizes.lora_params * FP32.itemsize // shards
    mb = geometry.micro_batch_size
    plan = ComponentPlan([
        Part("actor", "denoiser base weights", sizes.denoiser_bytes // shards,
             f"{format_count(sizes.denoiser_params)} params, {_dtype_name(sizes.dtype)}{per_rank}", swapped=True),
        Part("actor", "LoRA adapter default (trained)", lora, f"{format_count(sizes.lora_params)} params fp32{per_rank}",
             swapped=True),
        Part("actor", "LoRA adapter ema", lora, "same shapes as default", swapped=True),
        Part("actor", "LoRA gradients", lora, "fp32, default adapter only", transient=True),
        Part("actor", "AdamW state", ADAMW_STATES * lora, "exp_avg + exp_avg_sq, fp32", swapped=True),
        Part("actor", "weight sync buffer", sync_buffer_bytes(sizes.lora_params, shards),
             "one adapter, flat; after the update", transient=True, step="weight sync"),
        Part("actor", "micro-batch inputs", 2 * sizes.latent_bytes(mb) + sizes.cond_bytes(mb),
             f"x0 + x_t fp32 and conditioning for {mb} samples", transient=True),
    ])
    if shards > 1 and sizes.largest_block_bytes:
        plan.parts.append(Part("actor", "fsdp2 all-gathered weights", 3 * sizes.largest_block_bytes + sizes.non_block_bytes,
                               "3 largest blocks (current, prefetched, the next one's gather buffer) + the layers no "
                               "block holds", transient=True))
    cp = geometry.actor_cp
    if cp > 1 and sizes.hidden_size:
        plan.parts.append(Part("actor", "context-parallel all-to-all buffers",
                               8 * mb * tokens_per_rank(sizes, cp) * sizes.hidden_size * sizes.dtype.itemsize,
                               "q, k, v and the attention output, sent and received (Ulysses)", transient=True))
    plan.activation_bytes = activation_bytes(sizes, mb, training=True, checkpointing=checkpointing,
                                             context_parallel_size=cp)
    plan.activation_detail = (f"training, micro-batch {mb}, gradient checkpointing "
                              f"{'on' if checkpointing else 'off'}" + (f", sequence / {cp} (cp)" if cp > 1 else ""))
    return plan


def rollout_plan(sizes: ModelSizes, geometry: StepGeometry, family_cfg: Any) -> ComponentPlan:
    """One rollout worker: denoiser + 2 adapters + text encoders + VAE + one ``generate`` call's tensors."""
    lora = sizes.lora_params * FP32.itemsize
    n = geometry.samples_per_rollout_call
    offload_te, offload_vae = bool(family_cfg.offload_text_encoder), bool(family_cfg.offload_vae)
    plan = ComponentPlan([
        Part("rollout", "denoiser base weights", sizes.denoiser_bytes,
             f"{format_count(sizes.denoiser_params)} params, {_dtype_name(sizes.dtype)}, full replica", swapped=True),
        Part("rollout", "LoRA adapters default + ema", 2 * lora, "fp32", swapped=True),
    ])
    # offloaded encoders / VAE wait in host memory and visit the device only for their step of the rollout:
    # counted in that step below, not beside the sampler (encoding, sampling and decoding take turns)
    for name, size in sizes.text_encoder_bytes.items():
        where = "host memory; on the device only while encoding" if offload_te else _dtype_name(sizes.dtype)
        plan.parts.append(Part("rollout", f"text encoder {name}", size, where, counted=not offload_te))
    if sizes.vae_bytes:
        where = "host memory; on the device only while decoding" if offload_vae else "fp32"
        plan.parts.append(Part("rollout", "VAE", sizes.vae_bytes, where, counted=not offload_vae))
    plan.parts.append(Part("rollout", "generate call: noise + x0 + conditioning",
                           2 * sizes.latent_bytes(n) + sizes.cond_bytes(n * geometry.cfg_factor),
                           f"{n} samples per call (fp32 latents, conditioning per sample)", transient=True))
    cp = geometry.rollout_cp
    steps = {
        "encoding (the offloaded text encoders on the device)": sum(sizes.text_encoder_bytes.values()) * offload_te,
        (f"sampling, {n * geometry.cfg_factor} samples per denoiser call"
         + (f", sequence / {cp} (cp)" if cp > 1 else "")): activation_bytes(
            sizes, n * geometry.cfg_factor, training=False, checkpointing=False, context_parallel_size=cp) or 0,
        f"VAE decode of {sizes.decode_batch_size} samples at a time" + (" (the VAE on the device)" * offload_vae):
            decode_bytes(sizes) + sizes.vae_bytes * offload_vae,
    }
    plan.activation_detail = max(steps, key=steps.get)  # the rollout's steps take turns: the largest is its peak
    plan.activation_bytes = steps[plan.activation_detail]
    return plan


def env_plan(env_cfg: Any) -> ComponentPlan:
    """The reward models of both splits on an env device (``Reward.device_memory``; a model that the train and eval
    rewards share is held, and counted, once)."""
    from rlrunner.rewards import REWARDS, reward_config
    from rlrunner.rewards.registry import part_config

    parts: dict[tuple[str, str], Part] = {}
    for split in ("train", "eval"):
        cfg = reward_config(env_cfg[split].reward)
        for spec in [part_config(cfg, p) for p in cfg.rewards] if cfg.type == "multi" else [cfg]:
            if spec.model in OCR_REWARDS:
                parts[("OCR engine", "")] = Part("env", "OCR engine", 0, "not counted (PaddleOCR on a GPU: a few "
                                                 "hundred MB)", counted=False)
            for name, size, detail in getattr(REWARDS.get(spec.model), "device_memory", lambda _: [])(spec):
                parts[(name, detail)] = Part("env", name, max(size, 0), detail, counted=size >= 0)
    return ComponentPlan(list(parts.values()))


def host_buffer_parts(sizes: ModelSizes, geometry: StepGeometry) -> list[Part]:
    """One step's rollout result per rollout worker (host memory of its node; tensors return as CPU tensors)."""
    # a context-parallel group's first rank holds its shard
    rows, prompts = geometry.samples_per_rollout_group, geometry.prompts_per_rollout_group
    parts = [
        Part("rollout", "x0", sizes.latent_bytes(rows), f"[{rows}, {', '.join(map(str, sizes.shapes.latent))}] fp32"),
        Part("rollout", "conditioning, once per prompt", sizes.cond_bytes(prompts),
             f"{prompts} rows (repeated per sample it would be {format_bytes(sizes.cond_bytes(rows))})"),
        Part("rollout", "decoded pixels", sizes.pixel_bytes(rows),
             f"[{rows}, {', '.join(map(str, sizes.shapes.pixels))}] uint8"),
    ]
    if geometry.kept_latents:
        parts.insert(1, Part("rollout", "trajectory states the algorithm keeps",
                             geometry.kept_latents * sizes.latent_bytes(rows),
                             f"{geometry.kept_latents} fp32 latents per sample (algorithm.name and its options)"))
    return parts


def _dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in PRECISIONS.items()}[dtype]

"""The two LoRA adapters on one denoiser, on peft's public API: ``default`` (trained) and ``ema`` (old policy).

:class:`LoraAdapters` adds both adapters (same init), switches between them, copies their tensors in and out
(state dicts, checkpoints, weight sync) and saves / loads them in diffusers' LoRA file format.
LoRA tensors are kept in float32 whatever the base dtype, so that AdamW and the EMA (tau down to 0.01) do not
lose their small updates to bf16 rounding; peft casts the layer input to the adapter dtype and back.

Switching is the one place that goes below peft's public API (:func:`fast_switch`): peft's ``set_adapter``
walks every module and toggles ``requires_grad`` (ms per switch, paid twice per micro-batch for ``v_old``).
``tests/models/test_lora_switch.py`` compares :func:`fast_switch` with peft's ``set_adapter`` for every family,
so a peft release that renames what it writes fails CI instead of silently training the wrong adapter.
"""

from __future__ import annotations

import contextlib
import hashlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from rlrunner.utils.sharded import copy_full_, full_tensor

TRAINED_ADAPTER = "default"
EMA_ADAPTER = "ema"
ADAPTERS = (TRAINED_ADAPTER, EMA_ADAPTER)
#: the joint-attention projections of both streams of an MMDiT block (SD3, Qwen-Image): the reference code's
#: targets (flow_grpo / DiffusionNFT); "attn.*" leaves SD3.5's extra attn2 untouched
MMDIT_LORA_TARGETS = (
    "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
    "attn.to_k", "attn.to_out.0", "attn.to_q", "attn.to_v",
)

def last_block_text_stream(denoiser: nn.Module, projections: tuple[str, ...]) -> tuple[str, ...]:
    """The LoRA targets ``attn.<projection>`` of the last of ``denoiser.transformer_blocks``: an MMDiT's text stream
    ends there, so the projections that only feed the text output (its queries; its output projection, where the
    block has one) never get a gradient."""
    last = len(denoiser.transformer_blocks) - 1
    return tuple(f"transformer_blocks.{last}.attn.{name}" for name in projections)


#: the LoraConfig fields written into a saved file's metadata (what a loader needs to apply the same scale)
_SAVED_CONFIG_KEYS = ("r", "lora_alpha", "target_modules", "init_lora_weights", "lora_dropout", "bias", "use_rslora",
                      "use_dora")


def lora_config(target_modules: tuple[str, ...], rank: int, alpha: int, init: str | bool = "gaussian",
                exclude_modules: tuple[str, ...] = ()) -> Any:
    """peft's ``LoraConfig`` for one adapter of rank ``rank`` and scale ``alpha / rank`` on ``target_modules``, but
    not on ``exclude_modules`` (full module names or suffixes)."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights=init, target_modules=list(target_modules),
                      exclude_modules=list(exclude_modules) or None)


def lora_digest(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """A fingerprint of an adapter's tensors (a :meth:`LoraAdapters.state_dict`): int64 ``[2]``, the 128-bit BLAKE2b
    digest of every tensor's name, dtype, shape and bytes. Equal digests mean bitwise equal weights (up to the
    hash's collisions, ~2^-64), on any worker."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return torch.frombuffer(bytearray(digest.digest()), dtype=torch.int64).clone()


def fast_switch(layers: list[nn.Module], adapter: str | None) -> None:
    """Make ``adapter`` the active one on every LoRA layer (``None``: adapters off, the base model).

    Equivalent to peft's ``layer.enable_adapters(adapter is not None)`` + ``layer.set_adapter(adapter)`` without
    their ``requires_grad`` toggling: a LoRA layer's forward reads only these two attributes. Writing them into
    the instance dict skips ``nn.Module.__setattr__`` and shares one list, so a switch costs ~0.01 ms instead of
    ~3 ms. Guarded by ``tests/models/test_lora_switch.py`` against peft's own switch.
    """
    disabled, active = adapter is None, [adapter or TRAINED_ADAPTER]
    for layer in layers:
        attrs = vars(layer)
        attrs["_disable_adapters"] = disabled
        attrs["_active_adapter"] = active


def saved_config(target_modules: tuple[str, ...], rank: int, alpha: int, init: str | bool = "gaussian") -> dict[str, Any]:
    """The LoRA settings a saved file's metadata holds for an adapter made by :func:`lora_config` with these
    arguments: what :meth:`LoraAdapters.config_dict` returns, without a model (the driver writes the files)."""
    config = lora_config(target_modules, rank, alpha, init).to_dict()
    config["target_modules"] = sorted(config["target_modules"])
    return {k: v for k, v in config.items() if k in _SAVED_CONFIG_KEYS}


def write_lora(directory: str, state: dict[str, torch.Tensor], config: dict[str, Any], loader_class_name: str,
               component: str, weight_name: str | None = None) -> None:
    """Write one adapter's tensors (a :meth:`LoraAdapters.state_dict`) so that the pipeline's
    ``load_lora_weights(directory)`` loads them; needs no model, only its tensors and settings.

    ``loader_class_name`` is the pipeline's LoRA loader mixin in ``diffusers.loaders`` (importing it, not the
    pipeline, spares the pipeline's other imports; its ``save_lora_weights`` is a classmethod); ``component`` is
    the pipeline's name of the denoiser (``transformer``, or ``unet`` whose files use diffusers' older key names).
    ``config`` (:meth:`LoraAdapters.config_dict`) goes into the safetensors metadata, so the loader applies the
    same ``alpha / rank`` scale as training did; its targets are the modules the file holds (not the family's
    target suffixes, which also match modules a family leaves without LoRA: the loader would add empty ones).
    ``weight_name``: the file's name (default: diffusers' ``pytorch_lora_weights.safetensors``).
    """
    import diffusers.loaders
    from diffusers.utils import convert_state_dict_to_diffusers

    config = {**config, "target_modules": sorted({key.rsplit(".lora_", 1)[0] for key in state})}
    if component == "unet":
        state = convert_state_dict_to_diffusers(state)
    state = {k: v.contiguous() for k, v in state.items()}
    loader = getattr(diffusers.loaders, loader_class_name)
    loader.save_lora_weights(directory, safe_serialization=True, weight_name=weight_name, **{
        f"{component}_lora_layers": state, f"{component}_lora_adapter_metadata": config})


class LoraAdapters:
    """``default`` and ``ema`` LoRA adapters on ``denoiser`` (a diffusers model), base weights frozen.

    Args:
        denoiser: a diffusers ``ModelMixin`` (``add_adapter`` / ``peft_config``), modified in place.
        target_modules: module name suffixes that get LoRA (the family's ``lora_target_modules``).
        rank, alpha: LoRA rank and alpha (scale ``alpha / rank``).
        exclude_modules: targets that get no LoRA (modules whose output the model discards: a LoRA there never
            receives a gradient, which data-parallel engines cannot reduce).
    Saved files carry only the adapted modules' tensors; diffusers' loader injects LoRA where the file has keys.
    After construction ``default`` is active and trainable; ``ema`` holds a copy of it and never trains.
    """

    def __init__(self, denoiser: nn.Module, target_modules: tuple[str, ...], rank: int, alpha: int,
                 init: str | bool = "gaussian", exclude_modules: tuple[str, ...] = ()) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.denoiser = denoiser
        denoiser.requires_grad_(False)
        config = lora_config(target_modules, rank, alpha, init, exclude_modules)
        with warnings.catch_warnings():  # two adapters on one model is the point here, not a mistake
            warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
            for name in ADAPTERS:
                denoiser.add_adapter(config, adapter_name=name)
        self.layers = [m for m in denoiser.modules() if isinstance(m, BaseTunerLayer)]
        if not self.layers:
            raise ValueError(f"no module of {type(denoiser).__name__} matches the LoRA targets {list(target_modules)}")
        for pname, param in denoiser.named_parameters():
            if any(f".{a}." in pname for a in ADAPTERS):
                param.data = param.data.float()
            param.requires_grad_(f".{TRAINED_ADAPTER}." in pname)
        # ema starts as a copy of default; copied in place (no host round trip), so that an adapter built on the
        # meta device, as the simulator builds one (rlrunner/sizing/fake_build.py), needs no data
        with torch.no_grad():
            for ema, trained in zip(self.parameters(EMA_ADAPTER), self.parameters(TRAINED_ADAPTER), strict=True):
                ema.copy_(trained)
        fast_switch(self.layers, TRAINED_ADAPTER)

    # ------------------------------------------------------------------ switching
    @contextlib.contextmanager
    def use(self, adapter: str | None) -> Iterator[None]:
        """Run the block with ``adapter`` active (``None``: base model), then restore ``default``."""
        if adapter is not None and adapter not in ADAPTERS:
            raise ValueError(f"unknown adapter {adapter!r}; valid: {list(ADAPTERS)} or None (base model)")
        fast_switch(self.layers, adapter)
        try:
            yield
        finally:
            fast_switch(self.layers, TRAINED_ADAPTER)

    # ------------------------------------------------------------------ tensors
    def parameters(self, adapter: str) -> list[torch.Tensor]:
        """The adapter's LoRA tensors in a fixed order (the same order for both adapters)."""
        return list(self.named_parameters(adapter).values())

    def named_parameters(self, adapter: str) -> dict[str, torch.Tensor]:
        """The adapter's live LoRA tensors (sharded ones as DTensors), keyed as :meth:`state_dict`, in that order."""
        return {n.replace(f".{adapter}.", "."): p for n, p in self.denoiser.named_parameters() if f".{adapter}." in n}

    def state_dict(self, adapter: str) -> dict[str, torch.Tensor]:
        """LoRA tensors of ``adapter`` with the adapter name stripped from the keys (detached full copies, CPU).

        Tensors sharded over ranks (DTensors, FSDP2) are gathered, so every rank of the group must call it.
        """
        return {n: full_tensor(p.detach()).cpu().clone() for n, p in self.named_parameters(adapter).items()}

    @torch.no_grad()
    def load_state_dict(self, adapter: str, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` (as returned by :meth:`state_dict`) into ``adapter``; keys and shapes must match."""
        params = self.named_parameters(adapter)
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or unexpected:
            raise ValueError(f"LoRA state does not match the {adapter!r} adapter: missing {missing[:3]}"
                             f"{'...' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
                             f"{'...' if len(unexpected) > 3 else ''} (different model or LoRA targets?)")
        for name, param in params.items():
            if param.shape != state[name].shape:
                raise ValueError(f"LoRA tensor {name} has shape {tuple(state[name].shape)}, the model expects "
                                 f"{tuple(param.shape)} (different lora_rank or model?)")
            copy_full_(param, state[name])

    def config_dict(self, adapter: str) -> dict[str, Any]:
        """The adapter's LoRA settings as saved in a file's metadata (rank, alpha, sorted targets, ...)."""
        config = self.denoiser.peft_config[adapter].to_dict()
        config["target_modules"] = sorted(config["target_modules"])
        return {k: v for k, v in config.items() if k in _SAVED_CONFIG_KEYS}

    # ------------------------------------------------------------------ files (diffusers' LoRA format)
    def save(self, directory: str, adapter: str, loader_class_name: str, component: str,
             state: dict[str, torch.Tensor] | None = None) -> None:
        """Write ``adapter`` so that the pipeline's ``load_lora_weights(directory)`` loads it (:func:`write_lora`,
        with this model's LoRA settings); ``state``: the adapter's :meth:`state_dict` when the caller already has
        it (default: read it now)."""
        if adapter not in ADAPTERS:
            raise ValueError(f"unknown adapter {adapter!r}; valid: {list(ADAPTERS)}")
        write_lora(directory, state or self.state_dict(adapter), self.config_dict(adapter), loader_class_name,
                   component)

    def load(self, path: str, adapters: tuple[str, ...], loader_class_name: str, component: str) -> None:
        """Load a diffusers-format LoRA (folder, file or hub id, e.g. from :meth:`save`) into ``adapters``.

        Raises ``FileNotFoundError`` (nothing readable at ``path``) or ``ValueError`` (another rank / alpha scale,
        or tensors that do not fit), each naming ``path``.
        """
        state = self.read(path, loader_class_name, component)
        for adapter in adapters:
            self.load_state_dict(adapter, state)

    def read(self, path: str, loader_class_name: str, component: str,
             weight_name: str | None = None) -> dict[str, torch.Tensor]:
        """The tensors of a diffusers-format LoRA file (``weight_name`` in the folder ``path``; default: the
        loader's own file name), keyed as :meth:`state_dict`; errors as :meth:`load`'s, and a LoRA trained at
        another ``alpha / rank`` scale than this model's is refused."""
        import diffusers.loaders
        from diffusers.utils import convert_unet_state_dict_to_peft

        loader = getattr(diffusers.loaders, loader_class_name)
        where = f"lora_path {path!r}" + (f" ({weight_name})" if weight_name else "")
        try:
            loaded = loader.lora_state_dict(path, weight_name=weight_name, return_lora_metadata=True)
        except (OSError, ValueError) as err:
            raise FileNotFoundError(f"{where}: cannot read a diffusers LoRA there "
                                    f"({str(err).splitlines()[0]})") from err
        state, metadata = loaded[0], loaded[-1]  # UNet pipelines also return network alphas in between
        prefix = f"{component}."
        state = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
        if component == "unet":
            state = convert_unet_state_dict_to_peft(state)
        metadata = {k.removeprefix(prefix): v for k, v in (metadata or {}).items() if k.startswith(prefix)}
        ours = self.config_dict(TRAINED_ADAPTER)
        theirs = metadata.get("lora_alpha", ours["lora_alpha"]) / metadata.get("r", ours["r"])
        if metadata and theirs != ours["lora_alpha"] / ours["r"]:
            raise ValueError(f"{where} was trained with rank {metadata.get('r')} / alpha "
                             f"{metadata.get('lora_alpha')}, the recipe sets lora_rank {ours['r']} / lora_alpha "
                             f"{ours['lora_alpha']}; make them match")
        return state

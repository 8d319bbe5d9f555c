"""Loading CLIP-family scorers with ``transformers`` alone, and CLIP's image preprocessing as torch ops.

Paths are local folders/files or hub ids (``org/name``); a local path that lacks a file the scorer needs is a
``FileNotFoundError`` naming the file and the recipe key. Loaded models are shared by the rewards of one process
(the env worker builds a train and an eval reward; one copy of the weights serves both).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

#: openai CLIP's normalisation (also laion's ViT-H-14 and HPS's open_clip transform)
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json")
# where save_pretrained keeps the image processor's settings: transformers 5 writes them into processor_config.json
# (a CLIPProcessor's), 4.x into preprocessor_config.json; transformers' own loader reads both
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")

_CACHE: dict[tuple, Any] = {}
_CACHE_LOCK = threading.Lock()


def cached(key: tuple, load: Callable[[], Any]) -> Any:
    """``load()`` once per ``key`` in this process (thread-safe)."""
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = load()
        return _CACHE[key]


def is_local(path: str) -> bool:
    """A path on disk, or one written like one (``./x``, ``/x``, ``~/x``, ``a/b/c``): not a hub id ``org/name``."""
    return Path(path).expanduser().exists() or path.startswith((".", "/", "~")) or path.count("/") != 1


def local_file(path: str, names: tuple[str, ...], key: str, what: str) -> Path | None:
    """The first of ``names`` in local folder ``path``; ``None`` for a hub id. Raises FileNotFoundError naming
    ``key`` when the folder (or every one of ``names`` in it) is missing."""
    if not is_local(path):
        return None
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"{key}={path!r} is not a folder; give the folder of {what} (as written by "
                                f"save_pretrained) or a hub id like openai/clip-vit-large-patch14")
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{key}={path!r} has no {' or '.join(names)}; it must hold {what} "
                            f"(save_pretrained writes it), or use a hub id like openai/clip-vit-large-patch14")


def hub_or_local_file(path: str, filename: str, key: str) -> Path:
    """``path`` itself when it is a local file, ``path/filename`` of a local folder, else ``filename`` of hub repo
    ``path`` (downloaded once into the hub cache)."""
    if is_local(path):
        p = Path(path).expanduser()
        p = p / filename if p.is_dir() else p
        if not p.is_file():
            raise FileNotFoundError(f"{key}={path!r}: {p} does not exist; give the {filename} file, its folder or "
                                    f"a hub id that holds it")
        return p
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(path, filename))


def load_tokenizer(path: str, key: str) -> Any:
    from transformers import AutoTokenizer

    local_file(path, TOKENIZER_FILES, key, "a CLIP tokenizer (vocab.json + merges.txt, or tokenizer.json)")
    return AutoTokenizer.from_pretrained(str(Path(path).expanduser()) if is_local(path) else path)


def load_clip_model(path: str, key: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A ``transformers.CLIPModel`` (its ``config.json`` and weights) in eval mode on ``device``."""
    from transformers import CLIPModel

    local_file(path, ("config.json",), key, "a transformers CLIPModel")
    local_file(path, WEIGHT_FILES, key, "a transformers CLIPModel's weights")
    model = CLIPModel.from_pretrained(str(Path(path).expanduser()) if is_local(path) else path, dtype=dtype)
    return model.to(device).eval().requires_grad_(False)


@dataclass(frozen=True)
class ImageTransform:
    """CLIP's image preprocessing on the device: resize the shorter side to ``size`` (bicubic, antialiased as PIL's
    resize), centre-crop ``crop`` × ``crop``, scale to [0, 1] and normalise by ``mean`` / ``std``."""

    size: int = 224
    crop: int = 224
    mean: tuple[float, ...] = OPENAI_MEAN
    std: tuple[float, ...] = OPENAI_STD

    @staticmethod
    def from_processor(path: str, key: str) -> ImageTransform:
        """The settings of the image processor saved at ``path`` (``size.shortest_edge``, ``crop_size``,
        ``image_mean``/``image_std``), read by transformers' ``AutoImageProcessor`` (either file layout)."""
        from transformers import AutoImageProcessor

        local_file(path, PROCESSOR_FILES, key, "a CLIP image processor config")
        processor = AutoImageProcessor.from_pretrained(str(Path(path).expanduser()) if is_local(path) else path)
        size = _edge(getattr(processor, "size", None), ("shortest_edge", "height"))
        crop = _edge(getattr(processor, "crop_size", None), ("height", "shortest_edge")) or size
        return ImageTransform(size or 224, crop or 224, tuple(getattr(processor, "image_mean", None) or OPENAI_MEAN),
                              tuple(getattr(processor, "image_std", None) or OPENAI_STD))

    def __call__(self, images: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """uint8 ``[N, H, W, 3]`` -> ``[N, 3, crop, crop]`` in ``dtype`` on ``device``."""
        x = torch.from_numpy(np.ascontiguousarray(images)).to(device).permute(0, 3, 1, 2).float()
        h, w = x.shape[-2:]
        scale = self.size / min(h, w)
        new = (max(self.crop, round(h * scale)), max(self.crop, round(w * scale)))
        if new != (h, w):
            x = F.interpolate(x, size=new, mode="bicubic", align_corners=False, antialias=True)
        top, left = (new[0] - self.crop) // 2, (new[1] - self.crop) // 2
        x = x[..., top : top + self.crop, left : left + self.crop].clamp(0, 255) / 255.0
        mean = torch.tensor(self.mean, device=device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=device).view(1, 3, 1, 1)
        return ((x - mean) / std).to(dtype)


def _edge(size: Any, keys: tuple[str, ...]) -> int | None:
    """The first of ``keys`` set in an image processor's ``size`` (a dict, a ``SizeDict`` or a plain number)."""
    if size is None or isinstance(size, int):
        return size
    values = size if isinstance(size, dict) else vars(size)
    return next((int(values[k]) for k in keys if values.get(k) is not None), None)

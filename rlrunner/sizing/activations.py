"""The activation formulas of the memory plan: what a family's denoiser holds while it samples or trains, and what
its VAE holds while it decodes, from the sample shapes and the family's measured
:class:`~rlrunner.models.shapes.ActivationProfile` (``bin/rlrunner plan --simulate`` fixes the constants)."""

from __future__ import annotations

import math
from typing import Any


def activation_bytes(sizes: Any, batch: int, *, training: bool, checkpointing: bool,
                     context_parallel_size: int = 1) -> int | None:
    """Formula estimate of the denoiser's activation memory for ``batch`` samples on one rank, from ``sizes`` (a
    :class:`~rlrunner.sizing.memory.ModelSizes`); None without a transformer.

    ``s`` = image tokens / ``cp`` (+ text tokens per sample where they join the blocks' sequence,
    :attr:`ActivationProfile.text_in_sequence`; context parallelism over ``cp`` ranks splits the image tokens, and
    Ulysses' all-to-all trades the sequence split for a head split, so q, k, v stay ``s / cp × h`` per rank; the
    text is counted whole, an upper bound), ``h`` = hidden size, ``L`` = blocks, elements of the model dtype, with
    the family's :class:`~rlrunner.models.shapes.ActivationProfile` ``sampling`` and ``training``:

    * training with gradient checkpointing: ``L b s h`` (each block's input) + ``training b s h`` (the block being
      recomputed in backward); without it: ``training L b s h``;
    * inference (rollout): ``sampling b s h`` (one block at a time).

    Excluded: the text encoders' forward, allocator fragmentation and the CUDA context (~0.5-1 GB per process);
    the VAE decode is :func:`decode_bytes`.
    """
    if sizes.hidden_size is None or sizes.num_layers is None:
        return None
    profile = sizes.profile
    per_rank = math.ceil(sizes.shapes.image_tokens / context_parallel_size)
    per_rank += sizes.shapes.text_tokens if profile.text_in_sequence else 0
    tokens = batch * per_rank * sizes.hidden_size
    if not training:
        elements = profile.sampling * tokens
    elif checkpointing:
        elements = (sizes.num_layers + profile.training) * tokens
    else:
        elements = profile.training * sizes.num_layers * tokens
    return int(elements * sizes.dtype.itemsize)


def decode_bytes(sizes: Any) -> int:
    """The VAE decode's working memory: one decode call's samples (the family's ``decode_batch_size``), each a chunk
    of ``decode_chunk_frames`` frames at :attr:`ActivationProfile.decode` bytes per pixel."""
    pixels = sizes.shapes.pixels
    frames = pixels[0] if len(pixels) == 4 else 1
    height, width = pixels[-3], pixels[-2]
    chunk = min(frames, sizes.profile.decode_chunk_frames)
    return int(sizes.decode_batch_size * chunk * height * width * sizes.profile.decode)

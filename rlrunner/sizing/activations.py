"""The activation formulas of the memory plan: what a family's denoiser holds while it samples or trains, and what
its VAE holds while it decodes, from the sample shapes and the family's measured
:class:`~rlrunner.models.shapes.ActivationProfile`; and their inverse, the constants a full-size simulation
(``bin/rlrunner plan --simulate``) measures."""

from __future__ import annotations

import math
from typing import Any


def tokens_per_rank(sizes: Any, context_parallel_size: int = 1) -> int:
    """``s``: the image tokens one of ``context_parallel_size`` ranks holds, plus each sample's text tokens where they
    join the blocks' sequence (:attr:`ActivationProfile.text_in_sequence`; counted whole, an upper bound)."""
    text = sizes.shapes.text_tokens if sizes.profile.text_in_sequence else 0
    return math.ceil(sizes.shapes.image_tokens / context_parallel_size) + text


def decode_call_pixels(sizes: Any) -> int:
    """Pixels one VAE decode call produces at a time: the family's ``decode_batch_size`` samples, each a chunk of at
    most ``decode_chunk_frames`` frames."""
    pixels = sizes.shapes.pixels
    frames = pixels[0] if len(pixels) == 4 else 1
    chunk = min(frames, sizes.profile.decode_chunk_frames)
    return sizes.decode_batch_size * chunk * pixels[-3] * pixels[-2]


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
    tokens = batch * tokens_per_rank(sizes, context_parallel_size) * sizes.hidden_size
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
    return int(decode_call_pixels(sizes) * sizes.profile.decode)


def measured_constants(sizes: Any, activations: dict[str, int], *, sampling_batch: int, training_batch: int,
                       checkpointing: bool, rollout_cp: int = 1, actor_cp: int = 1) -> dict[str, float]:
    """The :class:`~rlrunner.models.shapes.ActivationProfile` constants that make :func:`activation_bytes` and
    :func:`decode_bytes` give a simulation's activation bytes: the inverse of those formulas on ``sizes`` (its
    structural fields, ``decode_chunk_frames`` and ``text_in_sequence``, as they are).

    ``activations`` holds the bytes of the simulated phases that have any, keyed ``rollout`` (one denoiser call of
    ``sampling_batch`` samples), ``update`` (a micro-batch of ``training_batch``) and ``decode``; a constant whose
    phase is absent is left out.
    """
    itemsize = sizes.dtype.itemsize

    def units(batch: int, cp: int) -> int:  # elements per constant: batch x tokens per rank x hidden size
        return batch * tokens_per_rank(sizes, cp) * sizes.hidden_size

    constants = {}
    if sizes.hidden_size is not None and sizes.num_layers is not None:
        if "rollout" in activations:
            constants["sampling"] = activations["rollout"] / itemsize / units(sampling_batch, rollout_cp)
        if "update" in activations:
            per_unit = activations["update"] / itemsize / units(training_batch, actor_cp)
            constants["training"] = per_unit - sizes.num_layers if checkpointing else per_unit / sizes.num_layers
    if "decode" in activations:
        constants["decode"] = activations["decode"] / decode_call_pixels(sizes)
    return constants

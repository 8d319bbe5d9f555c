"""The FSDP2 actor never holds its whole denoiser on the device: the build leaves it in host memory and FSDP2 moves it
one block at a time, keeping each rank's shards (``rlrunner/distributed/parallelize.py``). It used to be moved whole by
the build (``_place_components``), before ``parallelize`` sharded it: at real size the full Qwen-Image or A14B
denoiser on every rank, its freed memory kept in the actor's cache when the collocated rollout loads.

On CPU the host is the device, so the moves are recorded instead of measured: every ``Module.to`` and every
``fully_shard`` call on the denoiser's modules during the actor's construction, with the bytes of the full
(unsharded) parameters each one takes to the device.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cp_helpers import spawn
from omegaconf import OmegaConf
from torch import nn

A14B = "wan22_t2v_a14b"


def _full_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s parameters that are still whole tensors (not FSDP2 shards)."""
    from torch.distributed.tensor import DTensor

    return sum(p.numel() * p.element_size() for p in module.parameters() if not isinstance(p, DTensor))


def _recording_rank(rank: int, world_size: int, recipe: str, out: str) -> None:
    """Build an FSDP2 actor, recording the denoiser's moves to the device (module docstring)."""
    from torch.distributed import fsdp

    from rlrunner.workers.actor import ActorWorker

    moves: list[tuple[str, str, int]] = []  # (how, module class, full bytes it takes to the device)
    module_to, shard = nn.Module.to, fsdp.fully_shard

    def recording_to(self, *args, **kwargs):
        device = torch._C._nn._parse_to(*args, **kwargs)[0]  # None: a dtype cast in host memory, not a move
        if device is not None and type(self).__module__.startswith(("diffusers.models", "rlrunner.models")):
            moves.append(("to", type(self).__name__, _full_bytes(self)))
        return module_to(self, *args, **kwargs)

    def recording_shard(module, **kwargs):
        moves.append(("fully_shard", type(module).__name__, _full_bytes(module)))
        return shard(module, **kwargs)

    nn.Module.to, fsdp.fully_shard = recording_to, recording_shard
    cfg = OmegaConf.load(recipe)
    actor = ActorWorker(cfg.actor, cfg.algorithm, 1, rank=rank, world_size=world_size)
    nn.Module.to, fsdp.fully_shard = module_to, shard
    from torch.distributed.tensor import DTensor

    params = list(actor.model.transformer.parameters())
    torch.save({"moves": moves, "sharded": all(isinstance(p, DTensor) for p in params),
                "local_bytes": sum(p.to_local().numel() * p.element_size() for p in params)},
               Path(out) / f"load_rank{rank}.pt")


@pytest.mark.slow
def test_fsdp2_actor_moves_its_denoiser_to_the_device_one_block_at_a_time(tmp_path, tiny_model_cfg, load_tiny):
    """Two gloo ranks build the A14B actor under FSDP2: no move takes the whole denoiser (or a whole expert) to the
    device; the largest move is about one block's weights; afterwards each rank holds half of them, as shards."""
    from rlrunner.config.schema import ActorConfig, AlgorithmConfig
    from rlrunner.distributed.parallelize import transformer_blocks

    actor_cfg = OmegaConf.structured(ActorConfig(strategy="fsdp2", micro_batch_size=1, global_batch_size=2))
    actor_cfg.model = tiny_model_cfg(A14B)
    recipe = tmp_path / "recipe.yaml"
    OmegaConf.save(OmegaConf.create({"actor": actor_cfg, "algorithm": OmegaConf.structured(AlgorithmConfig())}),
                   recipe)
    spawn(_recording_rank, 2, str(recipe), str(tmp_path))
    denoiser = load_tiny(A14B).transformer
    total = _full_bytes(denoiser)
    # what one fully_shard call may move: a block, or an expert's weights outside its blocks (embeddings, proj_out)
    experts = (denoiser.transformer, denoiser.transformer_2)
    units = [_full_bytes(b) for e in experts for b in transformer_blocks(e)]
    units += [_full_bytes(e) - sum(_full_bytes(b) for b in transformer_blocks(e)) for e in experts]
    for rank in (0, 1):
        load = torch.load(tmp_path / f"load_rank{rank}.pt", weights_only=False)
        assert load["moves"], "nothing recorded: the recording itself is broken"
        assert any(how == "fully_shard" for how, _, _ in load["moves"])
        biggest = max(load["moves"], key=lambda move: move[2])
        assert biggest[2] <= max(units) < total / 2, f"rank {rank}: {biggest} of {total} bytes in one move"
        assert load["sharded"]
        assert load["local_bytes"] < 0.6 * total  # this rank's half (dim-0 shards, the first rank's a row larger)

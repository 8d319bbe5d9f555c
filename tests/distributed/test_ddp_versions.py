"""DDP is built with the buffer switch the installed torch has (``rlrunner/distributed/parallelize.py``).

torch 2.13 added ``forward_sync_buffers`` to :class:`~torch.nn.parallel.DistributedDataParallel` and deprecated
``broadcast_buffers``; older torch (2.11, the GPU machine's) has only ``broadcast_buffers`` and raises a TypeError at
``forward_sync_buffers``, so every DDP actor of more than one rank failed to build there. Two gloo ranks build the
DDP engine under a ``DistributedDataParallel`` with torch 2.11's constructor and train one optimizer step through it,
each rank on its own samples: both end with the gradient averaged over the ranks and the same parameters.
``bash bench/compat.sh`` runs the real actors under a real torch 2.11.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import ClassVar

import torch
import torch.multiprocessing as mp
from torch import nn

from rlrunner.distributed.parallelize import DDPEngine, parallelize
from rlrunner.distributed.process_group import find_free_port, init_distributed

WORLD_SIZE = 2
DIM = 4


class Torch211DDP(nn.parallel.DistributedDataParallel):
    """``DistributedDataParallel`` with torch 2.11's constructor: ``broadcast_buffers``, no ``forward_sync_buffers``
    (Python's TypeError if it is passed, as torch 2.11 gives). Records the switch it was built with."""

    built_with: ClassVar[dict[str, bool]] = {}

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True, init_sync=True,
                 process_group=None, bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False, delay_all_reduce_named_params=None,
                 param_to_hook_all_reduce=None, mixed_precision=None, device_mesh=None,
                 skip_all_reduce_unused_params=False, bucket_cap_mb_list=None):
        Torch211DDP.built_with = {"broadcast_buffers": broadcast_buffers}
        with warnings.catch_warnings():  # torch >= 2.13 deprecates broadcast_buffers; torch 2.11 says nothing
            warnings.simplefilter("ignore", FutureWarning)
            # positionally: torch 2.13 keeps these 18 parameters in this order and adds its new ones after them
            super().__init__(module, device_ids, output_device, dim, broadcast_buffers, init_sync, process_group,
                             bucket_cap_mb, find_unused_parameters, check_reduction, gradient_as_bucket_view,
                             static_graph, delay_all_reduce_named_params, param_to_hook_all_reduce, mixed_precision,
                             device_mesh, skip_all_reduce_unused_params, bucket_cap_mb_list)


class ToyFlowModel:
    """What the DDP engine uses of a FlowModel: ``transformer`` (the denoiser, here one linear layer and a buffer
    that holds this rank's number), ``velocity`` and ``device``."""

    def __init__(self, rank: int) -> None:
        torch.manual_seed(0)  # the same weights on every rank, as the same files give
        self.transformer = nn.Linear(DIM, DIM)
        self.transformer.register_buffer("rank", torch.tensor(float(rank)))
        self.device = torch.device("cpu")

    def velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.transformer(latents) * t[:, None] + cond["shift"]


def _samples(rank: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Rank ``rank``'s micro-batch of 2 samples: latents ``[2, DIM]``, t ``[2]``, cond ``{"shift": [2, DIM]}``."""
    gen = torch.Generator().manual_seed(10 + rank)
    latents, t = torch.randn(2, DIM, generator=gen), torch.rand(2, generator=gen)
    return latents, t, {"shift": torch.randn(2, DIM, generator=gen)}


def _loss(v: torch.Tensor) -> torch.Tensor:
    return (v ** 2).mean()


def _rank_main(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    nn.parallel.DistributedDataParallel = Torch211DDP  # this process's torch is torch 2.11's DDP from here on
    init_distributed(rank, WORLD_SIZE, "cpu", timeout_s=60)
    model = ToyFlowModel(rank)
    engine = parallelize(model, "ddp", WORLD_SIZE)
    optimizer = torch.optim.SGD(model.transformer.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.transformer.parameters()]
    with engine.accumulate(sync=True):
        _loss(engine.velocity(*_samples(rank))).backward()
    grad_norm = engine.clip_grad_norm(list(model.transformer.parameters()), max_norm=1e6)
    grads = [p.grad.clone() for p in model.transformer.parameters()]
    optimizer.step()
    torch.save({"engine": type(engine).__name__, "built_with": Torch211DDP.built_with, "grad_norm": grad_norm,
                "grads": grads, "before": before, "after": [p.detach() for p in model.transformer.parameters()],
                "rank_buffer": float(model.transformer.rank)}, Path(out) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def test_ddp_builds_and_trains_on_two_ranks_under_torch_2_11s_constructor(tmp_path):
    mp.spawn(_rank_main, args=(find_free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD_SIZE)]
    # the gradient each rank's own samples give, on one process: DDP must average them
    local = []
    for rank in range(WORLD_SIZE):
        model = ToyFlowModel(rank)
        _loss(model.velocity(*_samples(rank))).backward()
        local.append([p.grad for p in model.transformer.parameters()])
    mean = [(a + b) / 2 for a, b in zip(*local)]
    for rank, result in enumerate(ranks):
        assert result["engine"] == DDPEngine.__name__
        assert result["built_with"] == {"broadcast_buffers": False}  # the switch older torch has, turned off
        assert result["rank_buffer"] == rank  # buffers stay each rank's own: no broadcast at build or forward
        for grad, expected in zip(result["grads"], mean):
            torch.testing.assert_close(grad, expected)
        assert result["grad_norm"] == ranks[0]["grad_norm"] > 0
        for after, first_rank_after, before in zip(result["after"], ranks[0]["after"], result["before"]):
            assert torch.equal(after, first_rank_after) and not torch.equal(after, before)  # trained, in step
    assert not torch.equal(local[0][0], local[1][0])  # the ranks' samples differ: the average is not trivial


def test_the_installed_torch_builds_ddp_without_a_deprecation_warning():
    """The installed torch's own DDP, on a process group of one: built with the switch it has (torch >= 2.13 warns
    at ``broadcast_buffers``, older torch has no ``forward_sync_buffers``), and a step trains through it."""
    assert not torch.distributed.is_initialized()
    try:
        init_distributed(0, 1, "cpu", one_rank_group=True)
        model = ToyFlowModel(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            engine = parallelize(model, "ddp", 1, one_rank_group=True)
        assert isinstance(engine, DDPEngine)
        with engine.accumulate(sync=True):
            _loss(engine.velocity(*_samples(0))).backward()
        assert engine.clip_grad_norm(list(model.transformer.parameters()), max_norm=1e6) > 0
    finally:
        torch.distributed.destroy_process_group()

"""Context parallelism on CPU: peak activation memory per rank and step time for cp 1 vs cp 2, measured.

A Wan transformer (diffusers' ``WanTransformer3DModel``, random weights, Wan2.1's 16 latent channels, wider than the
test models so that the hidden states dominate the per-token memory as they do at 5120 wide) takes one training
forward + backward on a long video latent, on ``cp`` gloo ranks with Ulysses context parallelism through its
diffusers ``_cp_plan`` hooks (rlrunner.distributed.context_parallel), as the actor runs it. Each rank measures with
torch's memory profiler (``profile_memory``: every tensor allocation and free, categorised by the autograd graph):

- *activations*: the peak of the tensors torch's profiler classes as ``ACTIVATION`` (saved for backward);
- *working*: the peak of everything but parameters and gradients (activations, temporaries, autograd buffers,
  inputs), i.e. what the sequence costs on top of the weights.

The time is the median of ``--repeats`` steps without the profiler (one thread per rank: the ranks of cp 2 run side
by side on two cores, as two devices would).

    .venv/bin/python bench/context_parallel.py                      # 33 frames at 256 x 256: 2304 tokens
    .venv/bin/python bench/context_parallel.py --frames 61 --resolution 256 --repeats 5
    .venv/bin/python bench/context_parallel.py --quick    # seconds, tiny sizes: checks that it runs (a test does)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from diffusers import WanTransformer3DModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlrunner.distributed.context_parallel import apply_context_parallel, parallel_mesh

# columns of torch.profiler._memory_profiler.MemoryProfileTimeline's coalesced sizes (index 0 is unused)
CATEGORY_COLUMNS = {"parameter": 1, "optimizer_state": 2, "input": 3, "temporary": 4, "activation": 5,
                    "gradient": 6, "autograd_detail": 7, "unknown": 8}
#: ``--quick``: the smallest model and latent that cp 2 still splits (2 heads, 4 tokens), one timed step
QUICK = {"frames": 1, "resolution": 32, "heads": 2, "head_dim": 8, "layers": 1, "repeats": 1}


def build_transformer(args: argparse.Namespace):
    torch.manual_seed(0)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=args.heads, attention_head_dim=args.head_dim,
                                 in_channels=16, out_channels=16, text_dim=64, freq_dim=32,
                                 ffn_dim=4 * args.heads * args.head_dim, num_layers=args.layers, cross_attn_norm=True,
                                 qk_norm="rms_norm_across_heads", rope_max_seq_len=1024)


def inputs(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """latent ``[1, 16, F', H/8, W/8]``, timestep ``[1]``, text ``[1, 16, 64]`` (seeded: the same on every rank)."""
    generator = torch.Generator().manual_seed(1)
    frames, side = 1 + (args.frames - 1) // 4, args.resolution // 8
    latent = torch.randn(1, 16, frames, side, side, generator=generator)
    return latent, torch.tensor([500.0]), torch.randn(1, 16, 64, generator=generator)


def step(model, latent: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor) -> None:
    out = model(hidden_states=latent, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]
    out.square().mean().backward()
    model.zero_grad(set_to_none=True)


def peaks(prof) -> dict[str, int]:
    """Peak bytes of the activations and of all non-parameter, non-gradient tensors, from the memory timeline."""
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    skip = {CATEGORY_COLUMNS["parameter"], CATEGORY_COLUMNS["gradient"]}
    working = [sum(v for i, v in enumerate(row) if i not in skip) for row in sizes]
    return {"activation": max(row[CATEGORY_COLUMNS["activation"]] for row in sizes), "working": max(working)}


def rank_main(rank: int, cp: int, port: int, args: argparse.Namespace, out: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    model = build_transformer(args)
    if cp > 1:
        torch.distributed.init_process_group("gloo", rank=rank, world_size=cp)
        apply_context_parallel(model, parallel_mesh("cpu", cp, cp, "ulysses"))
    batch = inputs(args)
    step(model, *batch)  # warm-up
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step(model, *batch)
        times.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step(model, *batch)
    torch.save({"seconds": statistics.median(times), **peaks(prof)}, Path(out) / f"cp{cp}_rank{rank}.pt")
    if cp > 1:
        torch.distributed.destroy_process_group()


def measure(cp: int, args: argparse.Namespace, out: str) -> list[dict]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # forked, the ranks start with the imports done here (torch and diffusers: seconds of CPU per process)
    mp.start_processes(rank_main, args=(cp, port, args, out), nprocs=cp, join=True, start_method="fork")
    return [torch.load(Path(out) / f"cp{cp}_rank{r}.pt") for r in range(cp)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=33, help="pixel frames, 4k + 1 (default 33: 9 latent frames)")
    parser.add_argument("--resolution", type=int, default=256, help="square side in pixels, a multiple of 16")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per run (median)")
    parser.add_argument("--quick", action="store_true",
                        help="seconds, tiny sizes (1 frame at 32x32, 1 block of 2 heads x 8, 1 timed step; sizes "
                             "given still apply): checks that the script runs (tests/project/test_bench_scripts.py)")
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    tokens = (1 + (args.frames - 1) // 4) * (args.resolution // 16) ** 2
    print(f"Wan transformer {args.layers} blocks x {args.heads} heads x {args.head_dim}, {args.frames} frames at "
          f"{args.resolution}x{args.resolution}: {tokens} tokens per sample; one training forward + backward, fp32, CPU")
    with tempfile.TemporaryDirectory() as out:
        results = {cp: measure(cp, args, out) for cp in (1, 2)}
    mib = 2**20
    print(f"{'cp':>3} {'rank':>5} {'activations (MiB)':>18} {'working (MiB)':>14} {'step (s)':>9}")
    for cp, ranks in results.items():
        for rank, r in enumerate(ranks):
            print(f"{cp:>3} {rank:>5} {r['activation'] / mib:>18.1f} {r['working'] / mib:>14.1f} {r['seconds']:>9.3f}")
    one, two = results[1][0], max(results[2], key=lambda r: r["working"])
    print(f"cp 2 / cp 1 per rank: activations {two['activation'] / one['activation']:.2f}, working "
          f"{two['working'] / one['working']:.2f}, step time "
          f"{max(r['seconds'] for r in results[2]) / one['seconds']:.2f}")


if __name__ == "__main__":
    main()

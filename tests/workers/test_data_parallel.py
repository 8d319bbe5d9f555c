"""The data-parallel actor: the same adapters whatever the number of ranks and the engine (DDP, FSDP2), and
checkpoints that resume on another number of ranks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from diffusers import UNet2DConditionModel
from runner_helpers import small_recipe, train_metrics

from rlrunner.algorithms.samplers import sample_xt
from rlrunner.distributed.parallelize import Engine, parallelize, transformer_blocks
from rlrunner.run.runner import run
from rlrunner.step.sample_order import optimizer_step_shards


def test_each_optimizer_step_covers_the_same_samples_whatever_the_ranks():
    # 8 samples, optimizer steps of 4: step 0 is samples 0-3, step 1 samples 4-7
    assert [s.tolist() for s in optimizer_step_shards(8, 4, 1)] == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert [s.tolist() for s in optimizer_step_shards(8, 4, 2)] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert [s.tolist() for s in optimizer_step_shards(8, 4, 4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    with pytest.raises(ValueError, match="6 samples cannot form whole optimizer steps of 4 shared by 2 ranks"):
        optimizer_step_shards(6, 4, 2)


def test_engine_choice_and_fsdp2_blocks():
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, cross_attention_dim=8, sample_size=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    blocks = transformer_blocks(unet)
    for i, block in enumerate(blocks):  # children are sharded before the blocks that hold them
        assert not any(inner is block for outer in blocks[:i] for inner in outer.modules())
    assert {type(b).__name__ for b in blocks} <= set(unet._no_split_modules)
    with pytest.raises(ValueError, match=r"Linear names no block classes in _no_split_modules.*actor.strategy=ddp"):
        transformer_blocks(torch.nn.Linear(2, 2))
    assert type(parallelize(object(), "fsdp2", world_size=1)) is Engine  # one rank: nothing to wrap
    with pytest.raises(ValueError, match=r"actor.strategy='zero' is not valid; choose one of \['ddp', 'fsdp2'\]"):
        parallelize(object(), "zero", world_size=2)


def test_per_sample_generators_make_a_sample_s_noise_independent_of_its_batch():
    x0 = torch.randn(4, 1, 2, 3)
    seeded = [torch.Generator().manual_seed(seed) for seed in (5, 6, 7, 8)]
    x_t, t, eps = sample_xt(x0, 10, generator=seeded)
    for i, seed in enumerate((5, 6, 7, 8)):  # sample i alone, with its own generator, draws the same k and ε
        alone_x_t, alone_t, alone_eps = sample_xt(x0[i:i + 1], 10, generator=[torch.Generator().manual_seed(seed)])
        assert torch.equal(alone_t, t[i:i + 1]) and torch.equal(alone_eps, eps[i:i + 1])
        assert torch.equal(alone_x_t, x_t[i:i + 1])
    torch.testing.assert_close(x_t, (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps)
    with pytest.raises(ValueError, match="3 generators for a batch of 4 samples"):
        sample_xt(x0, 10, generator=seeded[:3])


# 16 samples per step (4 prompts x 4), one optimizer step of 16 per step, micro-batches of 4, no eval; the tiny
# recipe's learning rate (Adam turns float noise in near-zero gradients into steps of up to lr)
DP_RUN = ("actor.optim.lr=1e-3", "env.train.total_num_envs=16", "algorithm.group_size=4", "actor.global_batch_size=16",
          "actor.micro_batch_size=4", "runner.val_check_interval=0", "runner.sample_log_interval=0",
          "runner.val_before_train=false", "runner.max_steps=2", "runner.save_interval=1", "cluster.backend=ray",
          "cluster.worker_timeout_s=300")


def _placement(actor_ranks: int) -> tuple[str, str]:
    """Actor on devices 0..n-1; rollout and env share device n, so every run samples the same rollouts."""
    actor = "0" if actor_ranks == 1 else f"0-{actor_ranks - 1}"
    return (f"cluster.num_devices_per_node={actor_ranks + 1}",
            f"cluster.component_placement={{actor: {actor}, rollout: {actor_ranks}, env: {actor_ranks}}}")


def _dp_run(root: Path, name: str, actor_ranks: int, strategy: str, *overrides: str) -> Path:
    """One actor rank runs in this process, the reference the Ray runs with more ranks must equal (a Ray run equals
    an in-process one: tests/run/test_runner.py), without the start-up of three Ray workers."""
    log_dir = root / "logs" / name
    log_dir.mkdir(parents=True)
    start = time.monotonic()
    backend = ("cluster.backend=local",) if actor_ranks == 1 else ()
    run(small_recipe(root, *DP_RUN, *_placement(actor_ranks), f"actor.strategy={strategy}", *backend, *overrides),
        log_dir)
    print(f"{name}: {time.monotonic() - start:.1f} s")
    return log_dir


def _actor_state(log_dir: Path, step: int) -> dict:
    return torch.load(log_dir / f"checkpoints/global_step_{step}/actor.pt", weights_only=False)


def _max_adapter_diff(a: dict, b: dict) -> float:
    return max((a["adapters"][name][key] - b["adapters"][name][key]).abs().max().item()
               for name in ("default", "ema") for key in a["adapters"][name])


@pytest.mark.ray
@pytest.mark.slow
def test_adapters_do_not_depend_on_the_number_of_actor_ranks_or_the_engine(ray_session, tmp_path):
    """1, 2 and 4 actor ranks, DDP and FSDP2, same global batch: the same adapters after 2 steps (≤ 1e-5).
    Checkpoints are the same files for every engine and rank count: the 4-rank runs resume the 2-rank runs'
    step-1 checkpoints (DDP -> FSDP2 and FSDP2 -> DDP) and end where the uninterrupted 1-rank run (in this process)
    ends."""
    single = _dp_run(tmp_path, "20260101-000000-ddp1", 1, "ddp")
    reference = _actor_state(single, 2)
    assert _max_adapter_diff(reference, _actor_state(single, 1)) > 1e-4  # the second step moved the adapters
    ddp2 = _dp_run(tmp_path, "20260101-000001-ddp2", 2, "ddp")
    fsdp2 = _dp_run(tmp_path, "20260101-000002-fsdp2", 2, "fsdp2")
    ddp4 = _dp_run(tmp_path, "20260101-000003-ddp4", 4, "ddp",
                   f"runner.resume_dir={fsdp2 / 'checkpoints' / 'global_step_1'}")
    fsdp4 = _dp_run(tmp_path, "20260101-000004-fsdp4", 4, "fsdp2",
                    f"runner.resume_dir={ddp2 / 'checkpoints' / 'global_step_1'}")
    for log_dir, ranks in ((ddp2, 2), (fsdp2, 2), (ddp4, 4), (fsdp4, 4)):
        state = _actor_state(log_dir, 2)
        assert state["world_size"] == ranks
        assert _max_adapter_diff(state, reference) <= 1e-5, log_dir.name
        steps = train_metrics(log_dir)
        for ours, theirs in zip(steps, train_metrics(single)[-len(steps):]):
            assert ours["step"] == theirs["step"]
            for key in ("env/avg", "train/actor/nft_loss", "train/actor/grad_norm"):
                assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), (log_dir.name, key)
        for name, moments in reference["optimizer"]["state"].items():  # resumed, not restarted: Adam's moments
            for key in ("exp_avg", "exp_avg_sq"):
                scale = moments[key].abs().max().item()
                torch.testing.assert_close(state["optimizer"]["state"][name][key], moments[key], rtol=1e-3,
                                           atol=1e-4 * scale)
    assert [m["step"] for m in train_metrics(ddp4)] == [m["step"] for m in train_metrics(fsdp4)] == [2]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["awm", "flow_grpo"])
def test_other_algorithms_train_the_same_adapters_on_one_or_two_ddp_ranks(ray_session, tmp_path, algorithm):
    """FlowGRPO trains on the states its rollout kept and AWM on noise seeded per sample: both give the same adapters
    on 1 actor rank (in this process) and 2 (Ray actors, gloo DDP), placed where placement.json says."""
    runs = [_dp_run(tmp_path, f"20260101-00000{ranks}-{algorithm}{ranks}", ranks, "ddp", f"algorithm.name={algorithm}",
                    "runner.max_steps=1") for ranks in (1, 2)]
    single, double = (_actor_state(log_dir, 1) for log_dir in runs)
    assert double["world_size"] == 2
    assert all(m["train/actor/grad_norm"] > 0 for log_dir in runs for m in train_metrics(log_dir))  # it trained
    assert _max_adapter_diff(single, double) <= 1e-5
    placed = json.loads((runs[1] / "placement.json").read_text())
    assert sorted((w["component"], w["rank"]) for w in placed) == [("actor", 0), ("actor", 1), ("env", 0), ("rollout", 0)]
    assert all(w["node_id"] and w["node_ip"] for w in placed)  # Ray actors on a Ray node, not in-process


def test_one_rank_fsdp2_shards_into_dtensors_and_trains_like_the_plain_engine(tmp_path):
    """actor.one_rank_group: one gloo rank forms a process group of its own, FSDP2 shards the denoiser into DTensors
    over a one-rank mesh, and an update through it (gathers, reduce-scatter, clip) gives the plain engine's adapters."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from rlrunner.distributed.parallelize import FSDP2Engine
    from rlrunner.workers.actor import ActorWorker
    from rlrunner.workers.rollout import RolloutWorker

    one_step = ("actor.strategy=fsdp2", "actor.global_batch_size=4", "actor.micro_batch_size=4")
    cfg = small_recipe(tmp_path, *one_step, "actor.one_rank_group=true")
    train = RolloutWorker(cfg.actor.model, seed=0).generate(["a", "b"], 2, step=0, round_index=0).train
    plain_cfg = small_recipe(tmp_path, *one_step)  # one rank, no group: nothing wrapped
    plain = ActorWorker(plain_cfg.actor, plain_cfg.algorithm, num_train_steps=2)
    assert type(plain.engine) is not FSDP2Engine and not dist.is_initialized()
    try:
        sharded = ActorWorker(cfg.actor, cfg.algorithm, num_train_steps=2)
        assert dist.get_world_size() == 1 and dist.get_backend() == "gloo"
        assert isinstance(sharded.engine, FSDP2Engine) and sharded.params
        assert all(isinstance(p, DTensor) and p.device_mesh.size() == 1 for p in sharded.params)
        inputs = ([train], torch.arange(4), torch.arange(4), torch.tensor([-1.0, 0.5, 1.0, -0.5]), 0)
        metrics = [worker.update(*inputs) for worker in (plain, sharded)]
        assert metrics[1]["grad_norm"] == pytest.approx(metrics[0]["grad_norm"], rel=1e-5)
        for name, state in plain.lora_weights().items():
            gathered = sharded.lora_weights()[name]
            assert gathered.keys() == state.keys()
            for key, value in state.items():
                torch.testing.assert_close(gathered[key], value, rtol=0, atol=1e-5)  # as the rank-count test
        assert any(not torch.equal(state["default"][k], state["ema"][k]) for state in [plain.lora_weights()]
                   for k in state["default"])  # the update moved the trained adapter away from the EMA one
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()

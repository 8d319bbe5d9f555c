"""The weight sync sends the rollout workers only the adapters they sample with, each as one flat buffer.

NFT rolls out with ``ema`` (its old policy), FlowGRPO and AWM with ``default``; the eval samples ``default``, which
NFT's sync leaves out, so the eval fetches it. Under FSDP2 an adapter is gathered with one all-gather (not one per
LoRA tensor) and unpacked by name and shape, bitwise equal to the per-tensor gather.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cp_helpers import spawn
from omegaconf import OmegaConf
from runner_helpers import small_recipe
from sync_helpers import sync_rank

from rlrunner.models import ADAPTERS
from rlrunner.objectives import OBJECTIVES, objective_class
from rlrunner.run.runner import run
from rlrunner.utils.flat_state import is_flat, pack_flat, sync_buffer_bytes, unpack_flat
from rlrunner.workers.rollout import RolloutWorker


def _assert_same_state(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    assert list(ours) == list(theirs)
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and ours[name].shape == tensor.shape, name
        assert torch.equal(ours[name], tensor), name


def test_flat_buffer_round_trips_names_shapes_and_dtypes_exactly():
    gen = torch.Generator().manual_seed(0)
    state = {"blocks.0.lora_A.weight": torch.randn(4, 8, generator=gen),
             "blocks.0.lora_B.weight": torch.randn(8, 4, generator=gen).to(torch.bfloat16),
             "scale": torch.tensor(0.3, dtype=torch.float64), "empty": torch.zeros(0, 3),
             "half": torch.randn(2, 3, 5, generator=gen).half()}
    flat = pack_flat(state)
    assert is_flat(flat) and not is_flat(state) and flat["buffer"].ndim == 1
    assert flat["buffer"].numel() == sum(t.numel() for t in state.values())
    assert flat["buffer"].dtype == torch.float64  # the promoted dtype: every value casts back exactly
    _assert_same_state(unpack_flat(flat), state)
    # plain values only: a checkpoint that holds it loads with weights_only
    path = Path(__file__).parent / ".flat_roundtrip.pt"
    try:
        torch.save(flat, path)
        _assert_same_state(unpack_flat(torch.load(path, weights_only=True)), state)
    finally:
        path.unlink(missing_ok=True)


def test_sync_buffer_bytes_counts_the_gathered_buffer_and_the_local_shard():
    assert sync_buffer_bytes(1000, 1) == 4000  # unsharded: the packed copy
    assert sync_buffer_bytes(1000, 8) == 4000 + 500  # fsdp2: gathered [8, 125] plus this rank's 125


@pytest.mark.slow
def test_fsdp2_sync_gathers_each_adapter_with_one_all_gather_on_2_gloo_ranks(tmp_path):
    cfg = small_recipe(tmp_path, "actor.strategy=fsdp2")
    recipe = tmp_path / "recipe.yaml"
    OmegaConf.save(cfg, recipe)
    spawn(sync_rank, 2, str(recipe), str(tmp_path))
    ranks = [torch.load(tmp_path / f"sync_rank{r}.pt", weights_only=False) for r in range(2)]
    first = ranks[0]
    assert first["sharded"] and first["flat"]["default"] is not None and ranks[1]["flat"]["default"] is None
    num_tensors = len(first["per_tensor"]["default"])
    assert num_tensors > 2
    for rank in ranks:  # one all-gather per adapter on every rank, no per-tensor gather
        assert rank["counts"] == {name: (1, 0) for name in ADAPTERS}
    for name in ADAPTERS:
        flat = first["flat"][name][name]
        assert is_flat(flat)
        _assert_same_state(unpack_flat(flat), first["per_tensor"][name])
        _assert_same_state(first["unpacked"][name], first["per_tensor"][name])
    assert not torch.equal(first["flat"]["default"]["default"]["buffer"], first["flat"]["ema"]["ema"]["buffer"])
    for rank in ranks:  # rows that do not split evenly (one rank holds fewer or none), fp32 beside bf16
        assert rank["uneven_counts"] == (1, 0)
        _assert_same_state(unpack_flat(rank["uneven"]), rank["uneven_reference"])


#: the adapters each sync sends in a 2-step run with an eval after step 2: at start, after steps 1 and 2, then
#: what the eval fetches (the trained adapter, where the sync did not carry it)
def _expected_syncs(name: str) -> list[list[str]]:
    sampling = objective_class(name).sampling_adapter
    syncs = [[sampling]] * 3
    return syncs if sampling == "default" else [*syncs, ["default"]]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_sync_sends_only_the_adapter_the_rollout_samples_with(tmp_path, monkeypatch, name):
    synced: list[dict] = []
    original = RolloutWorker.sync_weights
    monkeypatch.setattr(RolloutWorker, "sync_weights",
                        lambda self, adapters: synced.append(adapters) or original(self, adapters))
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    run(small_recipe(tmp_path, f"algorithm.name={name}", "runner.max_steps=2", "runner.val_check_interval=2",
                     "runner.val_before_train=false", "runner.save_interval=2", "runner.sample_log_interval=0"),
        log_dir)
    assert [sorted(adapters) for adapters in synced] == _expected_syncs(name)
    assert all(is_flat(flat) for adapters in synced for flat in adapters.values())
    # what the rollout got after step 2 (sync and eval) is the actor's adapters at step 2, bitwise
    saved = torch.load(log_dir / "checkpoints/global_step_2/actor.pt", weights_only=False)["adapters"]
    for adapters in synced[2:]:
        for adapter, flat in adapters.items():
            _assert_same_state(unpack_flat(flat), saved[adapter])

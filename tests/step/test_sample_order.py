"""The sample-position contract (rlrunner/step/sample_order.py): train order, rows per actor rank, positions."""

from __future__ import annotations

import pytest
import torch

from rlrunner.step.batch import Batch
from rlrunner.step.data_plane import RolloutParts
from rlrunner.step.sample_order import TrainPlan, noise_seed, optimizer_step_shards, train_order
from rlrunner.utils.seeding import derive_seed
from rlrunner.workers.rollout import RolloutOutput


def test_each_rank_gets_its_rows_of_every_shard_and_puts_them_in_its_training_order():
    # 8 samples in 2 shards of 4, global batch 4 on 2 ranks: positions [0, 1, 4, 5] and [2, 3, 6, 7]
    plan = TrainPlan(torch.tensor([5, 2, 7, 0, 3, 6, 1, 4]), optimizer_step_shards(8, 4, 2))
    assert plan.samples(0).tolist() == [5, 2, 3, 6] and plan.samples(1).tolist() == [7, 0, 1, 4]
    assert [plan.shard_rows(0, 0, 4), plan.shard_rows(0, 4, 4)] == [[2, 3], [1, 2]]  # samples 2, 3 | 5, 6
    assert [plan.shard_rows(1, 0, 4), plan.shard_rows(1, 4, 4)] == [[0, 1], [0, 3]]  # samples 0, 1 | 4, 7
    # rank 0 holds samples [2, 3, 5, 6] and trains 5, 2, 3, 6; rank 1 holds [0, 1, 4, 7] and trains 7, 0, 1, 4
    assert plan.local_index(0).tolist() == [2, 0, 1, 3] and plan.local_index(1).tolist() == [3, 0, 1, 2]


def test_a_rank_joining_its_parts_trains_exactly_the_rows_of_the_whole_batch_it_used_to_select():
    sizes, prompts_per_shard, group = [6, 6, 12], [3, 3, 6], 2
    shards = [Batch({"x0": torch.randn(n, 3)}, {}, {"cond.emb": torch.randn(p, 5, 2)},
                    torch.arange(p).repeat_interleave(group)) for n, p in zip(sizes, prompts_per_shard)]
    whole = Batch.cat(shards)
    for world_size in (1, 2, 4):
        plan = TrainPlan.build(seed=3, step=7, num_samples=24, global_batch_size=8, world_size=world_size)
        offsets = [0, 6, 12]
        for rank in range(world_size):
            rows = [plan.shard_rows(rank, o, n) for o, n in zip(offsets, sizes)]
            parts = [shard.select(r) for shard, r in zip(shards, rows)]
            assert sum(len(p) for p in parts) == 24 // world_size  # only its own rows
            mine = Batch.cat(parts).select(plan.local_index(rank))
            today = whole.select(plan.samples(rank))  # every rank fetching everything, then selecting
            assert torch.equal(mine.tensors["x0"], today.tensors["x0"])
            assert torch.equal(mine.per_sample()["cond.emb"], today.per_sample()["cond.emb"])
        # the ranks' rows partition the batch
        every = torch.cat([plan.samples(r) for r in range(world_size)]).sort().values
        assert every.tolist() == list(range(24))


def test_train_order_and_noise_seeds_depend_only_on_seed_step_and_position():
    order = train_order(11, 4, 16)
    expected = torch.randperm(16, generator=torch.Generator().manual_seed(derive_seed(11, "train-order", 4)))
    assert torch.equal(order, expected)
    assert torch.equal(TrainPlan.build(11, 4, 16, 8, 2).order, order)
    assert noise_seed(11, 4, 5, 0) == derive_seed(11, "actor-noise", 4, 5, 0)


def test_the_ranks_of_a_context_parallel_group_train_their_group_s_share():
    """4 ranks in CP groups of 2 train as 2 data-parallel ranks would, each rank of a group the same rows."""
    plan, dp = TrainPlan.build(3, 7, 8, 4, 4, context_parallel_size=2), TrainPlan.build(3, 7, 8, 4, 2)
    assert (plan.groups, plan.world_size, [plan.group_of(r) for r in range(4)]) == (2, 4, [0, 0, 1, 1])
    for rank in range(4):
        group = rank // 2
        assert torch.equal(plan.samples(rank), dp.samples(group))
        assert torch.equal(plan.local_index(rank), dp.local_index(group))
        assert torch.equal(plan.group_positions(rank), dp.positions[group])
        assert plan.shard_rows(rank, 4, 4) == plan.group_rows(group, 4, 4) == dp.shard_rows(group, 4, 4)
    with pytest.raises(ValueError, match="3 actor ranks cannot form groups of context_parallel_size 2"):
        TrainPlan.build(3, 7, 8, 4, 3, context_parallel_size=2)


def test_a_rollout_group_s_leader_cuts_its_shard_and_the_other_ranks_return_nothing():
    plan = TrainPlan.build(3, 7, 8, 4, 2)
    shard = RolloutOutput(train=Batch({"x0": torch.arange(4.0)}), scored=Batch({"images": torch.arange(4)}))
    cuts = RolloutParts.per_rank_cuts(plan, offsets=[0, 4], sizes=[4, 4], to_log=1, context_parallel_size=2)
    assert len(cuts) == 4 and all(len(c) == plan.groups + 2 for c in cuts)  # a part per actor group, scored, logged
    assert all(cut(shard) is None for rank in (1, 3) for cut in cuts[rank])
    for group in range(plan.groups):  # the leader of shard 0 (rank 0) cuts each actor group's rows of samples 0-3
        assert cuts[0][group](shard).tensors["x0"].tolist() == [float(r) for r in plan.group_rows(group, 0, 4)]
    assert cuts[0][plan.groups](shard) is shard.scored and len(cuts[0][-1](shard)) == 1 and len(cuts[2][-1](shard)) == 0

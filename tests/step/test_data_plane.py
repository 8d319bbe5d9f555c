"""The data plane: conditioning travels once per prompt, and with Ray the rollout's tensors go from the rollout
workers to the env and actor workers by object reference; the driver holds only what it logs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from runner_helpers import small_recipe

from rlrunner.run.runner import Runner, run
from rlrunner.step.batch import Batch
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.rollout import RolloutWorker

PROMPTS = ['a sign that says "2345"', 'a sign that says "2346"', 'a sign that says "2347"']


def _repeated(train: Batch) -> Batch:
    """The same samples with the conditioning repeated for every sample (the data plane before once-per-prompt)."""
    rows = train.per_sample()
    return Batch(dict(train.tensors), {}, rows, torch.arange(len(train)))


def test_nft_loss_gradients_and_update_are_the_same_with_conditioning_once_per_prompt(tmp_path):
    cfg = small_recipe(tmp_path, "actor.global_batch_size=12", "actor.micro_batch_size=4", "env.train.total_num_envs=12")
    train = RolloutWorker(cfg.actor.model, seed=0).generate(PROMPTS, 4, step=0, round_index=0).train
    assert train.num_prompts == 3 and len(train) == 12
    repeated = _repeated(train)
    assert repeated.num_prompts == 12
    advantages = torch.linspace(-1.0, 1.0, 12)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))

    actor = ActorWorker(cfg.actor, cfg.algorithm, num_train_steps=2)
    results = []
    for batch in (repeated, train):
        micro = batch.select(order[:4])  # a shuffled micro-batch, as the actor trains on
        micro.tensors["advantages"] = advantages[order[:4]]
        actor.optimizer.zero_grad(set_to_none=True)
        loss, metrics = actor._micro_loss(micro, torch.Generator().manual_seed(7))
        loss.backward()
        results.append((loss.detach(), metrics, [p.grad.clone() for p in actor.params]))
    (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = results
    assert torch.equal(loss_a, loss_b) and metrics_a == metrics_b
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))

    adapters = []
    for batch in (repeated, train):  # a whole update from the same initial adapters
        actor = ActorWorker(cfg.actor, cfg.algorithm, num_train_steps=2)
        actor.update([batch], order, torch.arange(12), advantages[order], step=0)
        adapters.append(actor.lora_weights())
    for name, state in adapters[0].items():
        assert all(torch.equal(tensor, adapters[1][name][key]) for key, tensor in state.items()), name


class SpyActor(ActorWorker):
    """The actor worker, recording what each ``update`` received (in its own Ray process)."""

    def update(self, rollout, index, sample_index, advantages, step):
        self.seen = [*getattr(self, "seen", []), [(type(part).__name__, sorted(part.tensors), sorted(part.per_prompt),
                                                  len(part)) for part in rollout]]
        return super().update(rollout, index, sample_index, advantages, step)

    def received(self) -> list:
        return self.seen


def _tensors(value) -> list:
    """Every tensor or array inside ``value`` (through containers, dataclasses and Batch fields)."""
    import numpy as np

    if isinstance(value, (torch.Tensor, np.ndarray)):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if hasattr(value, "__dataclass_fields__"):
        return _tensors(vars(value))
    return []


@pytest.mark.ray
@pytest.mark.slow
def test_with_ray_the_driver_holds_only_logged_samples_and_the_actor_no_pixels(tmp_path, monkeypatch):
    import ray

    from rlrunner.cluster import create_cluster, ray_backend

    overrides = ["runner.max_steps=2", "runner.save_interval=0", "runner.num_logged_samples=2"]
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    run(small_recipe(tmp_path, *overrides), local_dir)

    fetched, sent = [], []  # what the driver receives from workers, and the tensors it sends them
    real_gather, real_submit = ray_backend.gather, ray_backend.RayWorkerGroup._submit

    def gather(role, ips, method, refs, timeout_s, **kwargs):
        results = real_gather(role, ips, method, refs, timeout_s, **kwargs)
        fetched.append((role, method, results))
        return results

    def submit(group, method, per_rank, parts=None):
        sent.append((group.role, method, [t for _, payload in per_rank for t in _tensors(payload)]))
        return real_submit(group, method, per_rank, parts)

    monkeypatch.setattr(ray_backend, "gather", gather)
    monkeypatch.setattr(ray_backend.RayWorkerGroup, "_submit", submit)
    monkeypatch.setattr("rlrunner.run.runner.ActorWorker", SpyActor)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the spy is not importable on Ray workers
    cfg = small_recipe(tmp_path, *overrides, "cluster.backend=ray", "cluster.num_devices_per_node=3",
                       "cluster.worker_timeout_s=60", "cluster.component_placement={actor: 0, rollout: 1, env: 2}")
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir()
    with create_cluster(cfg.cluster) as cluster:
        runner = Runner(cfg, ray_dir, cluster)
        runner.fit()
        received = runner.actor.call("received")[0]
        runner.close()

    # the driver fetched from generate only the logged samples: 2 images per rollout (2 train steps, 2 evals)
    logged = [part for role, method, results in fetched if method == "generate" for part in results]
    assert all(isinstance(p, Batch) and set(p.tensors) == {"images"} and not p.per_prompt for p in logged)
    assert sum(len(p) for p in logged) == 4 * 2
    # nothing else it fetched holds a rollout tensor: rewards are per-sample scalars, the rest LoRA/optimizer state
    carrying = {method for _, method, results in fetched if _tensors(results) and method != "generate"}
    assert carrying <= {"collect", "lora_weights", "state_dict"}
    for _, method, results in fetched:
        if method == "collect":
            assert all(t.shape[0] <= 8 and t.ndim <= 2 for t in _tensors(results))
    # and it sent the env and actor workers handles, plus the actor's sample indices, their positions in the
    # training order and advantages ([8] each)
    assert all(not tensors for role, method, tensors in sent if method == "submit")
    update_tensors = [t for role, method, tensors in sent if method == "update" for t in tensors]
    assert len(update_tensors) == 2 * 3 and all(t.shape == (8,) for t in update_tensors)
    # the actor received the training parts of the 2 rollout shards (one per async-reward chunk), without pixels
    assert received == [[("Batch", ["x0"], ["cond.text_emb"], 4)] * 2] * 2

    local, remote = (torch.load(d / "checkpoints/global_step_2/actor.pt", weights_only=False)
                     for d in (local_dir, ray_dir))
    for name, state in local["adapters"].items():
        assert all(torch.equal(t, remote["adapters"][name][k]) for k, t in state.items()), name
    assert Path(ray_dir / "samples").is_dir()


class FetchCountingActor(ActorWorker):
    """The actor worker, counting what each ``update`` fetched from the rollout workers (in its own Ray process)."""

    def update(self, rollout, index, sample_index, advantages, step):
        import pickle

        self.fetched = [*getattr(self, "fetched", []), {
            "rows_per_part": [len(part) for part in rollout], "prompts_per_part": [p.num_prompts for p in rollout],
            "x0_bytes": sum(p.tensors["x0"].nbytes for p in rollout),
            "bytes": sum(len(pickle.dumps(p, protocol=5)) for p in rollout), "positions": sample_index.tolist()}]
        return super().update(rollout, index, sample_index, advantages, step)

    def counted(self) -> list:
        return self.fetched


@pytest.mark.ray
@pytest.mark.slow
def test_with_ray_each_actor_rank_fetches_only_the_rows_it_trains_on(tmp_path, monkeypatch):
    import ray

    from rlrunner.cluster import create_cluster

    # that the adapters match one rank's is tests/workers/test_data_parallel.py; this counts what each rank fetched
    overrides = ["runner.max_steps=1", "runner.save_interval=0", "runner.val_check_interval=0",
                 "runner.val_before_train=false", "runner.sample_log_interval=0"]
    monkeypatch.setattr("rlrunner.run.runner.ActorWorker", FetchCountingActor)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the spy is not importable on Ray workers
    cfg = small_recipe(tmp_path, *overrides, "cluster.backend=ray", "cluster.num_devices_per_node=4",
                       "cluster.worker_timeout_s=120", "cluster.component_placement={actor: 0-1, rollout: 2, env: 3}")
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir()
    with create_cluster(cfg.cluster) as cluster:
        runner = Runner(cfg, ray_dir, cluster)
        runner.fit()
        (rank0,), (rank1,) = runner.actor.call("counted")
        runner.close()

    # 8 samples in 2 rollout shards of 4 (2 async-reward rounds), global batch 4 on 2 ranks: each rank fetched one
    # part of each shard, 4 rows in all, the rows of the two ranks partitioning each shard
    assert [len(r["rows_per_part"]) for r in (rank0, rank1)] == [2, 2]
    assert sum(rank0["rows_per_part"]) == sum(rank1["rows_per_part"]) == 4
    assert [a + b for a, b in zip(rank0["rows_per_part"], rank1["rows_per_part"])] == [4, 4]
    assert rank0["positions"] == [0, 1, 4, 5] and rank1["positions"] == [2, 3, 6, 7]  # optimizer windows of 4
    latent = RolloutWorker(cfg.actor.model, seed=0).model.latent_shape
    x0_bytes_per_sample = 4 * int(torch.Size(latent).numel())  # float32
    assert rank0["x0_bytes"] == rank1["x0_bytes"] == 4 * x0_bytes_per_sample  # half of the step's 8 samples' x0
    # each shard is one prompt's group: a part carries that prompt's conditioning once, or none if it has no rows
    assert all(r["prompts_per_part"] == [int(n > 0) for n in r["rows_per_part"]] for r in (rank0, rank1))


def test_env_shares_cut_rollout_shards_into_equal_consecutive_pieces():
    from rlrunner.step.shares import env_shares

    # 3 shards of 4 samples (12) to 5 env workers: shares of ceil(12 / 5) = 3 samples, the last empty
    assert env_shares([4, 4, 4], 5) == [[(0, 0, 3)], [(0, 3, 4), (1, 0, 2)], [(1, 2, 4), (2, 0, 1)], [(2, 1, 4)],
                                     [(0, 0, 0)]]
    assert env_shares([8], 2) == [[(0, 0, 4)], [(0, 4, 8)]]
    assert env_shares([2, 2], 1) == [[(0, 0, 2), (1, 0, 2)]]


def test_reward_slices_cut_a_round_once_into_a_slice_per_scorer_thread_of_each_env_worker():
    from rlrunner.step.shares import reward_slices

    # 2 rollout shards of 6 samples, 2 env workers with 3 scorer threads: 6 consecutive slices of 2 samples
    assert reward_slices([6, 6], 2, 3) == [[[(0, 0, 2)], [(0, 2, 4)], [(0, 4, 6)]],
                                           [[(1, 0, 2)], [(1, 2, 4)], [(1, 4, 6)]]]
    assert reward_slices([3, 2], 1, 2) == [[[(0, 0, 3)], [(1, 0, 2)]]]
    # fewer samples than slices: empty slices are dropped, a worker without samples keeps one empty slice
    assert reward_slices([2], 2, 2) == [[[(0, 0, 1)], [(0, 1, 2)]], [[(0, 0, 0)]]]

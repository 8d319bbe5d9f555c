"""The in-process backend: same calls as Ray, eager and deterministic; plus create_cluster and init_distributed."""

from __future__ import annotations

import json
import os
from operator import itemgetter
from types import SimpleNamespace

import pytest
import torch
from cluster_toys import BrokenInit, Counter, DataParallel

from rlrunner.cluster import (
    BACKENDS,
    WorkerError,
    create_cluster,
    parse_placement,
    write_placement_report,
)
from rlrunner.cluster.local import LocalCluster
from rlrunner.distributed.process_group import init_distributed


def cluster_cfg(**overrides):
    """A ClusterConfig look-alike (this package reads attributes only)."""
    cfg = {
        "num_nodes": 1,
        "num_devices_per_node": 2,
        "component_placement": {"actor,env,rollout": "all"},
        "backend": "local",
        "ray_address": "",
        "cpus_per_worker": 1.0,
        "worker_timeout_s": 30.0,
        "enable_offload": False,
    }
    return SimpleNamespace(**{**cfg, **overrides})


@pytest.fixture
def cluster():
    with create_cluster(cluster_cfg()) as c:
        yield c


def test_create_cluster_uses_the_registry(cluster):
    assert isinstance(cluster, LocalCluster) and set(BACKENDS) == {"local", "ray"}
    assert cluster.placement.devices["actor"] == (0, 1) and cluster.device_type in ("cpu", "cuda", "npu")
    with pytest.raises(ValueError, match="unknown cluster.backend 'slurm'; valid: local, ray"):
        create_cluster(cluster_cfg(backend="slurm"))


def test_create_cluster_accepts_a_parsed_placement():
    placement = parse_placement({"actor": 0, "rollout": 1, "env": 1}, 1, 2)
    with pytest.raises(ValueError, match="partially overlap"):
        create_cluster(cluster_cfg(component_placement={"actor": "0-1", "rollout": 1, "env": 1}))
    with create_cluster(cluster_cfg(component_placement={"bogus": 1}), placement) as c:
        assert c.placement is placement


def test_result_parts_are_handed_on_as_the_values_themselves(cluster):
    group = cluster.spawn("rollout", Counter, (0, 1))
    parts = [(itemgetter("large"), itemgetter("small"))] * 2
    pending = group.scatter_async("tensors", [(3,), (3,)], per_rank_parts=parts)
    assert [int(t) for t in pending.part(1).get()] == [0, 1]
    large = pending.part(0).handles()
    assert torch.equal(large[1], torch.full((3,), 2.0))  # in-process, a handle is the value itself
    assert group.scatter("sum_of", [(large,), ([large[1]],)]) == [9.0, 6.0]


def test_spawn_passes_args_rank_and_world_size(cluster):
    group = cluster.spawn("rollout", Counter, (0, 1), 5, scale=2)
    assert group.world_size == len(group) == 2 and group.devices == (0, 1)
    assert group.call("identity") == [(0, 2), (1, 2)]
    assert group.call("value") == [10, 11]
    assert group.node_ips == ("127.0.0.1", "127.0.0.1")
    one = cluster.spawn("env", Counter, cluster.placement.devices_of("env"))
    assert one.call("value") == [0, 1] and cluster.groups == (group, one)


def test_placement_report_lists_every_worker_in_json_and_as_a_table(cluster, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cluster, "device_type", "cpu")  # in-process workers compute on the driver's device
    groups = [cluster.spawn("actor", Counter, (0, 1)), cluster.spawn("env", Counter, (1,))]
    entries = write_placement_report(groups, tmp_path)
    local = {"node_id": "local", "node_ip": "127.0.0.1", "device": "cpu"}
    assert entries == [{"component": "actor", "rank": 0, **local}, {"component": "actor", "rank": 1, **local},
                       {"component": "env", "rank": 0, **local}]
    assert json.loads((tmp_path / "placement.json").read_text()) == entries
    assert capsys.readouterr().err.splitlines() == [
        f"placement ({tmp_path / 'placement.json'}):",
        "  component  rank  node_ip    node_id  device",
        "  actor      0     127.0.0.1  local    cpu",
        "  actor      1     127.0.0.1  local    cpu",
        "  env        0     127.0.0.1  local    cpu",
    ]


def test_call_async_scatter_and_call_rank(cluster):
    group = cluster.spawn("actor", Counter, (0, 1))
    pending = group.call_async("add", 10)
    assert pending.done()
    assert pending.get() == [10, 11] and pending.get() == [10, 11]  # ran once, eagerly
    assert group.scatter("add", [(1,), (2,)]) == [11, 13]
    assert group.scatter_async("add", [(), ()], [{"x": 1}, {"x": 2}]).get() == [12, 15]
    assert group.call_rank(1, "value") == 15 and group.call("value") == [12, 15]
    with pytest.raises(ValueError, match="per_rank_args has 1 entries for 2 ranks"):
        group.scatter("add", [(1,)])
    with pytest.raises(TypeError, match=r"per_rank_args\[0\] must be a tuple of arguments, got int \(write \(x,\)"):
        group.scatter("add", [1, 2])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="actor has ranks 0..1, got rank 2"):
        group.call_rank(2, "value")
    with pytest.raises(AttributeError, match="no public method '_secret'"):
        group.call("_secret")


def test_method_exception_is_a_worker_error_with_traceback(cluster):
    group = cluster.spawn("rollout", Counter, (0, 1))
    with pytest.raises(WorkerError) as info:
        group.call("fail_on_rank", 1)
    err = info.value
    assert (err.role, err.rank, err.node_ip) == ("rollout", 1, "127.0.0.1")
    message = str(err)
    assert message.startswith("rollout worker rank 1 on 127.0.0.1 raised in 'fail_on_rank': RuntimeError: boom")
    assert "Traceback" in message and "cluster_toys.py" in message
    assert isinstance(err.__cause__, RuntimeError)
    pending = group.call_async("fail", "later")  # errors surface at .get(), as with Ray
    with pytest.raises(WorkerError, match="ValueError: later"):
        pending.get()


def test_constructor_exception_is_a_worker_error(cluster):
    with pytest.raises(WorkerError, match=r"env worker rank 0 on 127.0.0.1 raised in 'BrokenInit.__init__': OSError"):
        cluster.spawn("env", BrokenInit, (0,))
    assert cluster.groups == ()


def test_env_vars_only_during_construction_and_no_process_group(cluster):
    group = cluster.spawn("actor", Counter, (1,))
    assert group.call("env")[0]["RANK"] == os.environ.get("RANK", "")  # restored after the constructor
    single = cluster.spawn("rollout", DataParallel, (0,))
    assert single.call("average") == [[1.0, 1.0, 1.0]] and single.workers[0].joined is False
    with pytest.raises(WorkerError, match="in-process 'local' backend"):
        cluster.spawn("env", DataParallel, (0, 1))


def test_shutdown_is_idempotent_and_final():
    cluster = create_cluster(cluster_cfg())
    group = cluster.spawn("actor", Counter, (0,))
    group.shutdown()
    assert cluster.groups == ()
    with pytest.raises(RuntimeError, match="shut down"):
        group.call("value")
    cluster.shutdown()
    cluster.shutdown()
    with pytest.raises(RuntimeError, match="cluster is shut down"):
        cluster.spawn("actor", Counter, (0,))


def test_spawn_checks_devices(cluster):
    with pytest.raises(ValueError, match="outside the cluster of 2 devices"):
        cluster.spawn("actor", Counter, (0, 2))
    with pytest.raises(ValueError, match="repeat a device"):
        cluster.spawn("actor", Counter, (1, 1))
    with pytest.raises(TypeError, match="worker_cls must be a class"):
        cluster.spawn("actor", Counter(rank=0, world_size=1), (0,))  # type: ignore[arg-type]


def test_init_distributed_single_rank_and_bad_input(monkeypatch):
    assert init_distributed(0, 1, "cpu") is False
    with pytest.raises(ValueError, match="unknown device type 'tpu'; valid: cpu, cuda, npu"):
        init_distributed(0, 2, "tpu")
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        init_distributed(2, 2, "cpu")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.delenv("RLRUNNER_IN_PROCESS", raising=False)
    with pytest.raises(ValueError, match="needs env vars MASTER_ADDR, MASTER_PORT"):
        init_distributed(0, 2, "cpu")


def test_works_with_the_recipe_schema():
    schema = pytest.importorskip("rlrunner.config.schema")
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.structured(schema.ClusterConfig(backend="local", num_devices_per_node=2))
    with create_cluster(cfg) as c:
        assert c.placement.num_workers("rollout") == 2 and c.worker_timeout_s == cfg.worker_timeout_s
        assert c.spawn("env", Counter, c.placement.devices_of("env")).call("identity") == [(0, 2), (1, 2)]

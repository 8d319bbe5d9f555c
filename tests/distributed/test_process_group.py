"""torch.distributed set-up without Ray: the device a worker takes under Ray's NOSET_*_VISIBLE_DEVICES, the
rendezvous store bound to one address, the env a group gets, and timeouts from the recipe."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from rlrunner.distributed import process_group
from rlrunner.distributed.process_group import TIMEOUT_ENV, init_distributed, worker_env
from rlrunner.utils.device import DEVICE_INDEX_ENV, ray_device_index, use_ray_assigned_device

NOSET = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


@pytest.mark.parametrize(("ids", "environ", "expected"), [
    ({"GPU": ["3"]}, {}, None),  # Ray narrowed CUDA_VISIBLE_DEVICES to the worker's GPU: torch's device 0
    ({"GPU": ["3"]}, {NOSET: "1"}, ("cuda", 3)),  # every GPU visible: the one Ray assigned
    ({"GPU": ["6", "7"]}, {NOSET: "1", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, ("cuda", 2)),  # ids name visible devices
    ({"GPU": []}, {NOSET: "1"}, None),  # a CPU worker (env, on a CPU node)
    ({"NPU": ["1"]}, {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}, ("npu", 1)),
    ({"GPU": ["3"]}, {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}, None),
])
def test_the_device_ray_assigned_is_used_when_ray_leaves_the_visible_devices_alone(ids, environ, expected):
    assert ray_device_index(ids, environ) == expected


def test_an_assigned_device_outside_the_visible_ones_is_one_line_and_none_is_a_no_op():
    with pytest.raises(RuntimeError, match=r"^Ray assigned GPU 2 but CUDA_VISIBLE_DEVICES='0,1' does not list it "
                                           r"\(RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES is set\); start the Ray "
                                           r"node with the same CUDA_VISIBLE_DEVICES$"):
        ray_device_index({"GPU": ["2"]}, {NOSET: "1", "CUDA_VISIBLE_DEVICES": "0,1"})
    environ = {}
    use_ray_assigned_device({"GPU": ["3"]}, environ)  # no NOSET: nothing to pin (torch's device 0 is the worker's)
    assert environ == {}


def test_init_distributed_takes_the_assigned_device_before_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert process_group._local_device_index(8) == 1
    monkeypatch.setenv(DEVICE_INDEX_ENV, "5")
    assert process_group._local_device_index(8) == 5


def test_the_rendezvous_store_listens_on_the_given_address_only(monkeypatch):
    monkeypatch.setattr(process_group, "_RENDEZVOUS", None)
    port = process_group.bind_rendezvous("127.0.0.1", timeout_s=30)
    assert process_group.bind_rendezvous("127.0.0.1") == port  # idempotent
    client = dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=timedelta(seconds=30))
    client.set("key", "value")
    assert process_group._RENDEZVOUS.get("key") == b"value"
    with pytest.raises(ConnectionRefusedError):  # a TCPStore("0.0.0.0" or a host name) would accept this
        socket.create_connection(("127.0.0.2", port), timeout=5)


def test_only_a_group_with_a_rendezvous_gets_master_env_and_its_timeout():
    assert worker_env(1, 2, 1, 2) == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert worker_env(0, 2, 0, 2, "10.0.0.1", 29500, 3600.0) == {
        "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500", TIMEOUT_ENV: "3600.0"}


def test_collectives_wait_as_long_as_the_cluster_says(monkeypatch):
    """The cluster passes cluster.worker_timeout_s (here 4000 s) to the group; the gloo group waits that long."""
    monkeypatch.setenv(TIMEOUT_ENV, "4000")
    assert not dist.is_initialized()
    try:
        assert init_distributed(0, 1, "cpu", one_rank_group=True) is True
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        assert backend.options._timeout == timedelta(seconds=4000)
        assert init_distributed(0, 1, "cpu", one_rank_group=True) is True  # joined already: kept
    finally:
        dist.destroy_process_group()
    assert init_distributed(0, 1, "cpu") is False  # one rank, no group asked for

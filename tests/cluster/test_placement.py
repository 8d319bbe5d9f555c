"""cluster.component_placement parsing: the RLinf syntax, every error message, device detection."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlrunner.cluster import COMPONENTS, Placement, detect_devices_per_node, format_devices, parse_placement


def test_all_collocates_every_component_on_every_device():
    p = parse_placement({"actor,env,rollout": "all"}, num_nodes=2, devices_per_node=4)
    assert p.devices == {c: tuple(range(8)) for c in COMPONENTS}
    assert p.num_workers("actor") == 8 and p.num_devices == 8
    assert p.is_collocated("actor", "rollout") and p.is_collocated("env", "actor")
    assert p.components_on(5) == ("actor", "env", "rollout")
    assert [p.node_of(d) for d in (0, 3, 4, 7)] == [0, 0, 1, 1]
    assert p.local_index(6) == 2


def test_disjoint_ranges_across_nodes():
    p = parse_placement({"actor": "0-3", "rollout": "4-5", "env": "6-7"}, num_nodes=2, devices_per_node=4)
    assert p.devices == {"actor": (0, 1, 2, 3), "env": (6, 7), "rollout": (4, 5)}
    assert [p.num_workers(c) for c in ("actor", "rollout", "env")] == [4, 2, 2]
    assert not p.is_collocated("actor", "rollout")
    assert p.used_devices == tuple(range(8))
    assert p.components_on(4) == ("rollout",)


def test_single_ints_strings_spaces_and_partial_collocation():
    p = parse_placement({" actor , rollout ": " 0 - 2 ", "env": 3}, num_nodes=1, devices_per_node=4)
    assert p.devices["actor"] == p.devices["rollout"] == (0, 1, 2) and p.devices["env"] == (3,)
    assert parse_placement({"actor,rollout": "ALL", "env": "0"}, 1, 1).devices["env"] == (0,)
    assert parse_placement({"actor,rollout,env": "0"}, 1, 1).num_devices == 1


def test_placement_is_frozen_and_unused_devices_are_allowed():
    p = parse_placement({"actor,env,rollout": "2-3"}, num_nodes=1, devices_per_node=8)
    assert p.used_devices == (2, 3) and p.components_on(0) == ()
    with pytest.raises(AttributeError):
        p.num_nodes = 3  # type: ignore[misc]
    assert isinstance(p, Placement)


def test_format_devices():
    assert format_devices((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    assert format_devices([3]) == "3" and format_devices(()) == ""


# one case per message: (placement, num_nodes, devices_per_node, fragments the one-line message must contain)
ERRORS = {
    "unknown component": (
        {"actor,env,rolout": "all"},
        1,
        1,
        ["unknown component 'rolout'", "valid components: actor, env, rollout"],
    ),
    "empty name": ({"actor,,env": "all", "rollout": 0}, 1, 1, ["empty component name"]),
    "beyond cluster": (
        {"actor": "0-3", "rollout": "4-5", "env": "6-8"},
        2,
        4,
        ["reaches device 8", "8 devices (num_nodes=2 x 4 per node; device ids 0-7)", "num_devices_per_node"],
    ),
    "single int beyond": (
        {"actor,env,rollout": 1},
        1,
        1,
        ["reaches device 1", "1 device (num_nodes=1 x 1 per node; device id 0)"],
    ),
    "malformed text": ({"actor,env,rollout": "0:3"}, 1, 4, ["'0:3' is not a device range", "'a-b' like '0-3'"]),
    "malformed float": ({"actor,env,rollout": 1.5}, 1, 4, ["1.5 is not a device range"]),
    "malformed bool": ({"actor,env,rollout": True}, 1, 4, ["True is not a device range"]),
    "malformed list": ({"actor,env,rollout": [0, 1]}, 1, 4, ["[0, 1] is not a device range"]),
    "negative": ({"actor,env,rollout": -1}, 1, 4, ["device ids start at 0"]),
    "reversed": ({"actor,env,rollout": "3-1"}, 1, 4, ["'3-1' is reversed; write '1-3'"]),
    "placed twice": (
        {"actor,rollout": "all", "actor": "0", "env": "all"},
        1,
        2,
        ["places 'actor' twice (in 'actor,rollout' and 'actor')"],
    ),
    "named twice in a key": ({"actor,actor": "all", "env,rollout": "all"}, 1, 1, ["names a component twice"]),
    "missing": ({"actor,rollout": "all"}, 1, 1, ["does not place 'env'", "every component (actor, env, rollout)"]),
    "partial overlap": (
        {"actor": "0-3", "rollout": "2-5", "env": "6-7"},
        1,
        8,
        ["actor (devices 0-3) and rollout (devices 2-5) partially overlap on devices 2-3", "collocated"],
    ),
    "env subset": ({"actor,rollout": "0-3", "env": "1"}, 1, 4, ["actor (devices 0-3) and env (devices 1)"]),
    "bad num_nodes": ({"actor,env,rollout": "all"}, 0, 1, ["cluster.num_nodes must be an integer >= 1, got 0"]),
    "bad devices per node": ({"actor,env,rollout": "all"}, 1, 0, ["devices per node must be an integer >= 1"]),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_are_one_clear_line(case):
    spec, num_nodes, per_node, fragments = ERRORS[case]
    with pytest.raises(ValueError) as info:
        parse_placement(spec, num_nodes, per_node)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_wrong_types_are_type_errors():
    with pytest.raises(TypeError, match="must be a mapping like"):
        parse_placement([("actor", "all")], 1, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key 3 must be a component name"):
        parse_placement({3: "all"}, 1, 1)


def test_lookups_of_unknown_components_list_valid_names():
    p = parse_placement({"actor,env,rollout": "all"}, 1, 1)
    with pytest.raises(ValueError, match="unknown component 'critic'; valid components: actor, env, rollout"):
        p.num_workers("critic")
    with pytest.raises(ValueError, match="outside the cluster of 1 device "):
        p.node_of(1)


def test_accepts_an_omegaconf_mapping():
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"actor": "0-1", "rollout": "2", "env": 3})
    assert parse_placement(cfg, 1, 4).devices["rollout"] == (2,)


def test_detect_devices_per_node(monkeypatch):
    assert detect_devices_per_node(SimpleNamespace(num_devices_per_node=4)) == 4
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("rlrunner.cluster.resources.npu_available", lambda: False)
    assert detect_devices_per_node(SimpleNamespace(num_devices_per_node=0)) == 1  # one CPU "device"
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 8)
    assert detect_devices_per_node(SimpleNamespace(num_devices_per_node=0)) == 8
    with pytest.raises(ValueError, match="num_devices_per_node must be >= 0"):
        detect_devices_per_node(SimpleNamespace(num_devices_per_node=-2))


def test_detect_reads_a_connected_ray_cluster(monkeypatch):
    nodes = [
        {"Alive": True, "Resources": {"CPU": 8.0}},  # CPU-only head
        {"Alive": True, "Resources": {"CPU": 64.0, "NPU": 8.0}},
        {"Alive": False, "Resources": {"NPU": 16.0}},  # dead nodes do not count
    ]
    fake_ray = SimpleNamespace(is_initialized=lambda: True, nodes=lambda: nodes)
    monkeypatch.setitem(__import__("sys").modules, "ray", fake_ray)
    from rlrunner.cluster import detect_device_type

    assert detect_devices_per_node(SimpleNamespace(num_devices_per_node=0)) == 8
    assert detect_device_type() == "npu"
    nodes[1]["Resources"].pop("NPU")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # the driver's GPU does not count
    assert detect_device_type() == "cpu" and detect_devices_per_node(SimpleNamespace(num_devices_per_node=0)) == 1

"""What the driver ships to a cluster's nodes, and how a node's missing code or folder is read from Ray's report
(the real 2-node case: tests/cluster/test_shared_nothing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlrunner
from rlrunner.cluster.shipping import NodeSetupError, check_readable, job_runtime_env, missing_module

# the end of what Ray 2.60 reports for a host actor whose node cannot import rlrunner (captured from the test's node)
RAY_IMPORT_FAILURE = """The actor died because of an error raised in its creation task, ray::_WorkerHost.__init__() (pid=6906,
ip=192.0.2.2, actor_id=a9ad7aaf92a5eac6e4b9412902000000)
RuntimeError: The actor with name _WorkerHost failed to import on the worker. This may be because needed library
dependencies are not installed in the worker environment:
ModuleNotFoundError: No module named 'rlrunner.cluster'"""


def test_the_job_ships_the_package_folder_only_unless_the_nodes_have_it():
    env = job_runtime_env(True)
    assert env["py_modules"] == [str(Path(rlrunner.__file__).resolve().parent)]
    assert (Path(env["py_modules"][0]) / "cluster" / "shipping.py").is_file()
    assert "__pycache__" in env["excludes"]
    assert job_runtime_env(False) is None


def test_the_missing_module_is_read_from_rays_text():
    assert missing_module(RAY_IMPORT_FAILURE) == "rlrunner.cluster"
    assert missing_module("ModuleNotFoundError: No module named 'rlrunner'") == "rlrunner"
    assert missing_module("ModuleNotFoundError: No module named 'paddleocr'") is None  # not ours to explain


def test_an_unreadable_folder_is_named_with_its_key_and_the_fixes(tmp_path):
    check_readable({"actor.model.model_path": str(tmp_path)})
    missing = tmp_path / "model"
    with pytest.raises(NodeSetupError) as err:
        check_readable({"actor.model.model_path": str(missing)})
    assert str(err.value).startswith(f"cannot read actor.model.model_path={str(missing)!r}")
    assert "every node mounts" in str(err.value) and "hub id" in str(err.value)

"""Each logger backend runs offline into the run folder, and what RunLogger wrote is read back from its files."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from rlrunner.config.schema import LoggerConfig
from rlrunner.tracking import backends as logger_backends
from rlrunner.tracking.logger import RunLogger

IMAGES = np.full((2, 8, 8, 3), 200, np.uint8)
PROMPTS = ['a sign that says "ab"', 'a sign that says "cd"']


def _log_a_run(log_dir: Path, backend: str) -> None:
    cfg = LoggerConfig(logger_backends=[backend], project_name="proj", experiment_name="exp")
    run_logger = RunLogger(log_dir, cfg, config={"actor": {"lr": 0.001}})
    run_logger.scalars({"train/loss": 0.5}, step=3)
    run_logger.scalars({"train/loss": 0.25}, step=4)
    run_logger.samples("samples/train", IMAGES, PROMPTS, np.array([0.1, 0.9]), step=4)
    run_logger.close()


def _leveldb_records(path: Path, header: int = 7, block: int = 32768):
    """The records of a LevelDB-log file (wandb's .wandb run file): 32 KiB blocks of [crc32, length, type] chunks
    after a 7-byte file header; type 1 = a whole record, 2/3/4 = its first/middle/last piece."""
    raw, pos, record = path.read_bytes(), header, b""
    while pos + 7 <= len(raw):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # the zero padding at a block's end
            pos += left
            continue
        record += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            yield record
            record = b""


def test_wandb_offline_writes_its_run_into_the_log_folder(tmp_path: Path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -r requirements/loggers.txt)")
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _log_a_run(tmp_path, "wandb")
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    history, run, kinds = [], None, []
    for data in _leveldb_records(run_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kinds.append(record.WhichOneof("record_type"))
        if record.HasField("run"):
            run = record.run
        if record.HasField("history"):
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
    assert run is not None, f"no run record in {run_file} ({run_file.stat().st_size} bytes), records: {kinds}"
    assert (run.project, run.display_name) == ("proj", "exp")
    assert [(h["_step"], h["train/loss"]) for h in history if "train/loss" in h] == [(3, 0.5), (4, 0.25)]
    assert [(h["_step"], h["samples/train/_type"]) for h in history if "samples/train/_type" in h] == [(4, "image-file")]
    assert len(list(run_file.parent.glob("files/media/images/samples/train_4_*.png"))) == 1


def test_swanlab_offline_writes_its_run_into_the_log_folder(tmp_path: Path, monkeypatch):
    pytest.importorskip("swanlab", reason="swanlab is not installed (pip install -r requirements/loggers.txt)")
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    monkeypatch.setenv("SWANLAB_MODE", "offline")
    _log_a_run(tmp_path, "swanlab")
    (run_file,) = tmp_path.glob("swanlog/run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(run_file)
    records = []
    for data in reader:
        record = Record()
        record.ParseFromString(data)
        records.append(record)
    start = next(r.start for r in records if r.HasField("start"))
    assert (start.project, start.name) == ("proj", "exp")
    scalars = [(r.scalar.step, r.scalar.value.number) for r in records if r.HasField("scalar")
               and r.scalar.key == "train/loss"]
    assert scalars == [(3, 0.5), (4, 0.25)]
    assert [(r.media.key, r.media.step) for r in records if r.HasField("media")] == [("samples/train", 4)]


def test_mlflow_writes_a_file_store_into_the_log_folder(tmp_path: Path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow-skinny is not installed (pip install -r requirements/loggers.txt)")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _log_a_run(tmp_path, "mlflow")
    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    assert run.info.run_name == "exp" and run.data.params["actor.lr"] == "0.001"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")] == [(3, 0.5),
                                                                                                     (4, 0.25)]
    assert len(list(Path(run.info.artifact_uri.removeprefix("file://")).glob("images/samples~train*.png"))) == 1


def test_a_backend_that_is_not_installed_raises_its_install_line(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(logger_backends.PACKAGES, "wandb", ("wandb_not_installed_here", "wandb"))
    assert logger_backends.missing(["tensorboard", "wandb", "mlflow"]) == ["wandb"]
    with pytest.raises(ImportError, match=r"has 'wandb' but wandb is not installed; pip install wandb \(or pip"):
        RunLogger(tmp_path, LoggerConfig(logger_backends=["wandb"]))


def test_trackers_record_how_the_run_ended(tmp_path: Path, monkeypatch):
    """finished, failed, preempted: mlflow's FINISHED/FAILED/KILLED, swanlab's success/crashed/aborted, wandb's exit
    code with its preempting mark."""
    pytest.importorskip("mlflow", reason="mlflow-skinny is not installed (pip install -r requirements/loggers.txt)")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for status in ("finished", "failed", "preempted"):
        run_logger = RunLogger(tmp_path / status, LoggerConfig(logger_backends=["mlflow"], project_name="proj"))
        run_logger.scalars({"train/loss": 0.5}, step=1)
        run_logger.close(status)
        run_logger.close(status)  # a second close (a failure after the first) changes nothing
    statuses = {}
    for status in ("finished", "failed", "preempted"):
        client = MlflowClient(tracking_uri=f"file:{tmp_path / status / 'mlruns'}")
        (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
        statuses[status] = run.info.status
    assert statuses == {"finished": "FINISHED", "failed": "FAILED", "preempted": "KILLED"}


def test_wandb_and_swanlab_mark_a_preempted_run(tmp_path: Path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -r requirements/loggers.txt)")
    pytest.importorskip("swanlab", reason="swanlab is not installed (pip install -r requirements/loggers.txt)")
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader
    from wandb.proto import wandb_internal_pb2

    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "SWANLAB_MODE": "offline"}.items():
        monkeypatch.setenv(name, value)
    run_logger = RunLogger(tmp_path, LoggerConfig(logger_backends=["wandb", "swanlab"], project_name="proj"))
    run_logger.scalars({"train/loss": 0.5}, step=1)
    run_logger.close("preempted")
    (wandb_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = []
    for data in _leveldb_records(wandb_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        records.append(record)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "preempting" in kinds and [r.exit.exit_code for r in records if r.HasField("exit")] == [1]
    (swanlab_file,) = tmp_path.glob("swanlog/run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(swanlab_file)
    finishes = []
    for data in reader:
        record = Record()
        record.ParseFromString(data)
        if record.HasField("finish"):
            finishes.append(record.finish.state)
    assert [type(record.finish).DESCRIPTOR.fields_by_name["state"].enum_type.values_by_number[s].name
            for s in finishes] == ["RUN_STATE_ABORTED"]


def test_steps_replayed_after_a_restart_reach_wandb_at_growing_steps_and_replace_their_lines(tmp_path, monkeypatch):
    """Steps 1-3 logged, then a restart goes on from step 2: wandb (which drops a step it has passed) gets every
    call at a step past the one before, with the training step as ``global_step`` and as its charts' x axis;
    metrics.jsonl keeps one line per step, the replayed step's, and the restart's own line."""
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -r requirements/loggers.txt)")
    from wandb.proto import wandb_internal_pb2

    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(name, value)
    run_logger = RunLogger(tmp_path, LoggerConfig(logger_backends=["wandb"], project_name="proj"))
    for step in (1, 2, 3):
        run_logger.scalars({"train/loss": float(step)}, step)
    run_logger.samples("samples/train", IMAGES, PROMPTS, np.array([0.1, 0.9]), step=3)
    run_logger.replay_from(2)
    run_logger.scalars({"recovery/restarts": 1.0}, 2)
    for step in (3, 4):
        run_logger.scalars({"train/loss": 10.0 * step}, step)
    run_logger.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "train/loss": 1.0}, {"step": 2, "train/loss": 2.0},
                     {"step": 2, "recovery/restarts": 1.0}, {"step": 3, "train/loss": 30.0},
                     {"step": 4, "train/loss": 40.0}]
    (wandb_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    rows, step_metrics = [], {}
    for data in _leveldb_records(wandb_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.HasField("history"):
            items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            rows.append((record.history.step.num, json.loads(items["global_step"]), "train/loss" in items))
        if record.HasField("metric") and record.metric.step_metric:
            step_metrics[record.metric.glob_name] = record.metric.step_metric
    # step 3's row holds its scalars and its image; then the restart's row and the replayed steps, each later
    assert rows == [(1, 1.0, True), (2, 2.0, True), (3, 3.0, True), (4, 2.0, False), (5, 3.0, True), (6, 4.0, True)]
    assert step_metrics == {"*": "global_step"}

"""Prompt files of every format the field ships (.txt, .jsonl, .parquet, or a folder of them), their metadata on
its way to the rewards, and one line naming the file and line for each kind of bad file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlrunner.config.schema import EnvConfig
from rlrunner.data.prompts import PromptSet, load_prompt_set, load_prompts
from rlrunner.rewards import Reward, RewardOutput, build_reward
from rlrunner.rewards.registry import REWARDS
from rlrunner.step.batch import Batch
from rlrunner.workers.reward import RewardWorker

RECORDS = [{"prompt": 'a sign that says "ab"', "tag": "single_object", "include": [{"class": "sign", "count": 1}]},
           {"prompt": 'a mug that reads "cd"', "tag": "counting", "include": [{"class": "mug", "count": 2}]}]
META = [{k: v for k, v in r.items() if k != "prompt"} for r in RECORDS]


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_txt_file_and_folder_keep_one_prompt_per_line(tmp_path: Path):
    (tmp_path / "train.txt").write_text('a sign that says "ab"\n\n  a mug  \n')
    assert load_prompt_set(tmp_path, "train") == PromptSet(['a sign that says "ab"', "a mug"], [{}, {}])
    assert load_prompts(tmp_path / "train.txt", "ignored for a file") == ['a sign that says "ab"', "a mug"]


def test_jsonl_prompts_carry_the_other_keys_as_metadata(tmp_path: Path):
    file = _jsonl(tmp_path / "geneval.jsonl", [json.dumps(r) for r in RECORDS])
    assert load_prompt_set(file, "train") == PromptSet([r["prompt"] for r in RECORDS], META)
    (tmp_path / "test.jsonl").write_text(file.read_text())  # a folder finds <split>.jsonl
    assert load_prompt_set(tmp_path, "test") == PromptSet([r["prompt"] for r in RECORDS], META)
    renamed = _jsonl(tmp_path / "text.jsonl", ['{"text": "a red cube", "seed": 3}'])
    assert load_prompt_set(renamed, "train", prompt_key="text") == PromptSet(["a red cube"], [{"seed": 3}])


def test_parquet_prompt_column_and_metadata_columns(tmp_path: Path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -r requirements/loggers.txt)")
    import pyarrow.parquet as pq

    file = tmp_path / "prompts.parquet"
    pq.write_table(pa.table({"caption": ["a red cube", "two cats"], "level": [1, 2]}), file)
    assert load_prompt_set(file, "train", prompt_key="caption") == PromptSet(["a red cube", "two cats"],
                                                                            [{"level": 1}, {"level": 2}])
    with pytest.raises(ValueError) as err:
        load_prompt_set(file, "train")
    assert str(err.value) == (f"{file}: no 'prompt' column (columns: ['caption', 'level']); set "
                              f"env.<split>.dataset.prompt_key to the column that holds the prompt")


@pytest.mark.parametrize(("lines", "message"), [
    (['{"prompt": "a"}', '{"prompt": "b",}'], (":2: not valid JSON (Expecting property name enclosed in double quotes "
                                              "at column 16); each line of a .jsonl prompt file is one object")),
    (['{"prompt": "a"}', '', '["b"]'], ":3: a JSON list, not an object with a 'prompt' key"),
    (['{"text": "a", "tag": "x"}'], ":1: no 'prompt' key (keys: ['tag', 'text']); set env.<split>.dataset.prompt_key"),
    (['{"prompt": 3}'], ":1: 'prompt' is 3, not a non-empty text"),
    (['{"prompt": "a"}', '[' * 100_000], ":2: JSON nested too deeply to read"),
])
def test_a_bad_jsonl_line_is_named_by_file_and_line(tmp_path: Path, lines, message):
    file = _jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises((ValueError, TypeError)) as err:
        load_prompt_set(file, "train")
    assert str(err.value).startswith(f"{file}{message}")


def test_lines_split_at_universal_newlines_only_and_a_bom_is_dropped(tmp_path: Path):
    """U+2028 and NEL are text, not line breaks (str.splitlines breaks at both); \r\n and \r end lines."""
    records = [{"prompt": "a sign\u2028that says \"ab\"", "id": 0}, {"prompt": "caf\u00e9\u0085 menu", "id": 1}]
    jsonl = tmp_path / "u.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(json.dumps(r, ensure_ascii=False) for r in records).encode())
    assert "\u2028" in jsonl.read_text(encoding="utf-8")  # written raw, as ensure_ascii=False does
    assert load_prompt_set(jsonl, "train") == PromptSet([r["prompt"] for r in records], [{"id": 0}, {"id": 1}])
    txt = tmp_path / "u.txt"
    txt.write_bytes("\ufeffone\u0085prompt\rtwo\u2028still two\r\nthree\n".encode())
    assert load_prompts(txt, "train") == ["one\u0085prompt", "two\u2028still two", "three"]


def test_a_file_that_is_not_utf8_is_named_in_one_line(tmp_path: Path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ValueError) as err:
        load_prompt_set(bad, "train")
    assert str(err.value) == f"{bad}: not UTF-8 text (byte 3: invalid continuation byte); save the prompt file as UTF-8"


def test_a_repeated_prompt_keeps_each_rows_own_metadata(tmp_path: Path):
    """Rows, not prompt texts, carry metadata: verl-omni's parquet repeats a prompt with its own extra_info.index."""
    jsonl = _jsonl(tmp_path / "ids.jsonl", ['{"prompt": "a", "id": 0}', '{"prompt": "b", "id": 1}',
                                            '{"prompt": "a", "id": 2}'])
    assert load_prompt_set(jsonl, "train") == PromptSet(["a", "b", "a"], [{"id": 0}, {"id": 1}, {"id": 2}])
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -r requirements/loggers.txt)")
    import pyarrow.parquet as pq

    file = tmp_path / "verl.parquet"
    pq.write_table(pa.table({"prompt": ["a", "a"], "extra_info": [{"index": 7}, {"index": 8}]}), file)
    assert load_prompt_set(file, "train") == PromptSet(["a", "a"], [{"extra_info": {"index": 7}},
                                                                   {"extra_info": {"index": 8}}])


def test_an_unknown_suffix_or_a_folder_without_the_split_is_an_error(tmp_path: Path):
    (tmp_path / "prompts.json").write_text("[]")
    with pytest.raises(ValueError, match=r"has suffix '.json'; dataset.path takes a folder or a .txt / .jsonl / "
                                         r".parquet file"):
        load_prompt_set(tmp_path / "prompts.json", "train")
    with pytest.raises(FileNotFoundError, match=r"has no train.txt / train.jsonl / train.parquet"):
        load_prompt_set(tmp_path, "train")


class MetadataProbe(Reward):
    """Scores each sample with its prompt's ``score`` metadata (0 without): proves which record reached it."""

    name = "metadata_probe"
    uses_metadata = True
    seen: ClassVar[list[dict]] = []  # every record it was handed (in-process workers), in order

    def __call__(self, images: np.ndarray, prompts: list[str], metadata: list[dict] | None = None) -> RewardOutput:
        MetadataProbe.seen += metadata
        avg = np.array([m.get("score", 0.0) for m in metadata], np.float32)
        return RewardOutput(avg=avg, parts={self.name: avg})


@pytest.fixture(autouse=True)
def _metadata_probe(monkeypatch):
    """``reward.model: metadata_probe`` for this module's tests only: other tests list the registry's names."""
    monkeypatch.setitem(REWARDS, "metadata_probe", MetadataProbe)


def test_env_worker_hands_each_sample_its_rows_metadata():
    rewards = {"train": {"reward": {"model": "metadata_probe", "num_workers": 2}},
               "eval": {"reward": {"model": "jpeg_compressibility"}}}
    worker = RewardWorker(OmegaConf.merge(OmegaConf.structured(EnvConfig), rewards))
    worker.set_prompt_metadata({"train": [{"score": 0.25}, {"score": 0.75}, {}, {"score": 0.5}]})
    part = Batch({"images": torch.zeros(5, 4, 4, 3, dtype=torch.uint8)},
                 {"prompts": ["a", "a", "b", "c", "a"], "rows": [0, 0, 1, 2, 3]})  # rows 0 and 3: the same text
    ticket = worker.submit([[(part, 0, 3)], [(part, 3, 5)]], "train")  # two slices, one per scorer thread
    assert worker.collect(ticket).avg.tolist() == [0.25, 0.25, 0.75, 0.0, 0.5]
    worker.close()


def test_a_multi_reward_passes_metadata_to_the_parts_that_ask():
    multi = build_reward({"type": "multi", "rewards": [{"model": "metadata_probe", "weight": 3.0},
                                                        {"model": "image_stats", "weight": 1.0}]})
    images = np.zeros((2, 16, 16, 3), np.uint8)  # flat: image_stats scores 0
    out = multi(images, ["a", "b"], metadata=[{"score": 1.0}, {}])
    assert multi.uses_metadata and out.parts["metadata_probe"].tolist() == [1.0, 0.0]
    assert out.avg.tolist() == [0.75, 0.0]  # (3 x probe + 1 x image_stats) / 4


@pytest.mark.slow
def test_a_run_rewards_jsonl_metadata_and_logs_to_every_backend(tmp_path: Path, monkeypatch):
    """One tiny step: the held-out and training rewards read each row's record (one prompt on two rows with different
    ids and scores); the trackers get the scalars."""
    from runner_helpers import small_recipe, train_metrics

    from rlrunner.run.runner import run
    from rlrunner.tracking.backends import missing

    backends = ["tensorboard", *(b for b in ("wandb", "swanlab", "mlflow") if not missing([b]))]
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    train = _jsonl(tmp_path / "train.jsonl", [json.dumps({"prompt": 'a sign that says "12"', "id": i, "score": s})
                                              for i, s in ((0, 0.25), (1, 0.75))])
    test = _jsonl(tmp_path / "test.jsonl", [json.dumps({"prompt": f'a label "{n}"', "score": 1.0}) for n in range(4)])
    cfg = small_recipe(tmp_path, f"env.train.dataset.path={train}", f"env.eval.dataset.path={test}",
                       "env.train.reward.model=metadata_probe", "env.eval.reward.model=metadata_probe",
                       "runner.max_steps=1", "runner.save_interval=0", "runner.val_before_train=false",
                       f"runner.logger.logger_backends={backends}".replace("'", ""),
                       "runner.logger.project_name=prompts", "runner.logger.experiment_name=jsonl")
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    MetadataProbe.seen.clear()
    run(cfg, log_dir)
    (step,) = train_metrics(log_dir)
    assert step["env/avg"] == 0.5  # 4 samples of each row, scored 0.25 and 0.75 by their own records
    trained = [m for m in MetadataProbe.seen if "id" in m]
    assert sorted((m["id"], m["score"]) for m in trained) == [(0, 0.25)] * 4 + [(1, 0.75)] * 4
    evaluated = [m for m in (json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines())
                 if "eval/avg" in m]
    assert [m["eval/avg"] for m in evaluated] == [1.0]
    if "mlflow" in backends:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"file:{log_dir / 'mlruns'}")
        (mlflow_run,) = client.search_runs([client.get_experiment_by_name("prompts").experiment_id])
        assert mlflow_run.info.run_name == "jsonl"
        assert [m.value for m in client.get_metric_history(mlflow_run.info.run_id, "env/avg")] == [0.5]
    assert ("wandb" in backends) == bool(list(log_dir.glob("wandb/offline-run-*/run-*.wandb")))
    assert ("swanlab" in backends) == bool(list(log_dir.glob("swanlog/run-*/run-*.swanlab")))

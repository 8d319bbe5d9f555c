"""Prompt datasets and the seeded prompt sampler.

A dataset is a folder with ``<split>.txt`` / ``<split>.jsonl`` / ``<split>.parquet``, or one such file:

- ``.txt``: one prompt per line (the OCR target in double quotes);
- ``.jsonl``: one JSON object per line, the prompt under ``prompt_key`` and the rest per-prompt metadata (e.g.
  GenEval's ``tag``/``include``);
- ``.parquet``: a table with a ``prompt_key`` column; the other columns are metadata (needs pyarrow).

Files are read as UTF-8 (a leading BOM is dropped) and split into lines at ``\n``, ``\r\n`` and ``\r`` only: the
other characters :meth:`str.splitlines` breaks at (U+2028, NEL, form feed, ...) are text, and JSON writes U+2028
unescaped with ``ensure_ascii=False``.

Metadata travels with the row: the sampler draws row indices, the rollout tags each sample with its row, and the
env worker hands a reward that asks for it (:attr:`rlrunner.rewards.Reward.uses_metadata`) that row's record, so a
prompt may appear on several rows with different metadata (an ``id``, verl-omni's ``extra_info.index``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORMATS = (".txt", ".jsonl", ".parquet")


@dataclass
class PromptSet:
    """The prompts of one split and, row by row, each prompt's metadata (``{}`` for a ``.txt`` file)."""

    prompts: list[str]
    metadata: list[dict[str, Any]]


def dataset_file(path: str | Path, split: str) -> Path:
    """The prompt file of ``split``: ``path`` itself, or in a folder ``<split>.txt|.jsonl|.parquet`` (first found)."""
    path = Path(path).expanduser()
    if path.is_dir():
        found = [path / f"{split}{suffix}" for suffix in FORMATS if (path / f"{split}{suffix}").is_file()]
        if not found:
            raise FileNotFoundError(f"prompt folder {path} has no {' / '.join(split + s for s in FORMATS)} "
                                    f"(dataset.split={split!r})")
        return found[0]
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} not found (dataset.path={str(path)!r}, split={split!r})")
    if path.suffix not in FORMATS:
        raise ValueError(f"prompt file {path} has suffix {path.suffix!r}; dataset.path takes a folder or a "
                         f"{' / '.join(FORMATS)} file (rename a one-prompt-per-line file to .txt)")
    return path


def load_prompt_set(path: str | Path, split: str, prompt_key: str = "prompt") -> PromptSet:
    """The prompts and metadata of ``split`` (see the module docstring for the formats)."""
    file = dataset_file(path, split)
    read = {".txt": _read_txt, ".jsonl": _read_jsonl, ".parquet": _read_parquet}[file.suffix]
    prompts, metadata = read(file, prompt_key)
    if not prompts:
        raise ValueError(f"prompt file {file} has no prompts")
    return PromptSet(prompts, metadata)


def load_datasets(env_cfg: Any) -> dict[str, PromptSet]:
    """The ``train`` and ``eval`` prompt sets of the recipe's ``env`` section; the held-out set is the first
    ``env.eval.total_num_envs`` prompts of its file."""
    sets = {split: load_prompt_set(env_cfg[split].dataset.path, env_cfg[split].dataset.split,
                                   env_cfg[split].dataset.prompt_key) for split in ("train", "eval")}
    held_out, n = sets["eval"], env_cfg.eval.total_num_envs
    return {"train": sets["train"], "eval": PromptSet(held_out.prompts[:n], held_out.metadata[:n])}


def load_prompts(path: str | Path, split: str, prompt_key: str = "prompt") -> list[str]:
    return load_prompt_set(path, split, prompt_key).prompts


def _lines(file: Path) -> list[str]:
    """The lines of ``file``: UTF-8 text without a leading BOM, split at ``\n``, ``\r\n`` and ``\r`` only."""
    try:
        with file.open(encoding="utf-8-sig", newline=None) as lines:  # newline=None: universal newlines only
            return [line.rstrip("\n") for line in lines]
    except UnicodeDecodeError as err:
        raise ValueError(f"{file}: not UTF-8 text (byte {err.start}: {err.reason}); save the prompt file as "
                         f"UTF-8") from None


def _read_txt(file: Path, prompt_key: str) -> tuple[list[str], list[dict[str, Any]]]:
    prompts = [line.strip() for line in _lines(file) if line.strip()]
    return prompts, [{} for _ in prompts]


def _record_prompt(record: dict[str, Any], where: str, prompt_key: str) -> tuple[str, dict[str, Any]]:
    if prompt_key not in record:
        raise ValueError(f"{where}: no {prompt_key!r} key (keys: {sorted(record)}); set env.<split>.dataset.prompt_key "
                         f"to the key that holds the prompt")
    prompt = record[prompt_key]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: {prompt_key!r} is {prompt!r}, not a non-empty text")
    return prompt.strip(), {k: v for k, v in record.items() if k != prompt_key}


def _read_jsonl(file: Path, prompt_key: str) -> tuple[list[str], list[dict[str, Any]]]:
    prompts, metadata = [], []
    for number, line in enumerate(_lines(file), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{file}:{number}: not valid JSON ({err.msg} at column {err.colno}); each line of a "
                             f".jsonl prompt file is one object such as {{\"{prompt_key}\": \"...\"}}") from None
        except RecursionError:
            raise ValueError(f"{file}:{number}: JSON nested too deeply to read") from None
        if not isinstance(record, dict):
            raise TypeError(f"{file}:{number}: a JSON {type(record).__name__}, not an object with a {prompt_key!r} "
                            f"key")
        prompt, meta = _record_prompt(record, f"{file}:{number}", prompt_key)
        prompts.append(prompt)
        metadata.append(meta)
    return prompts, metadata


def _read_parquet(file: Path, prompt_key: str) -> tuple[list[str], list[dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError(f"prompt file {file} is parquet, which needs pyarrow; pip install pyarrow (or pip install "
                          f"-r requirements/loggers.txt)") from err
    table = pq.read_table(file)
    if prompt_key not in table.column_names:
        raise ValueError(f"{file}: no {prompt_key!r} column (columns: {table.column_names}); set "
                         f"env.<split>.dataset.prompt_key to the column that holds the prompt")
    pairs = [_record_prompt(row, f"{file}: row {i}", prompt_key) for i, row in enumerate(table.to_pylist())]
    return [p for p, _ in pairs], [m for _, m in pairs]


class PromptSampler:
    """Draws row indices of a prompt set in shuffled epochs from a seeded generator; its state is part of the run
    state.

    Each call to :meth:`sample` returns ``num_prompts`` distinct-when-possible rows, continuing through a
    permutation of the dataset and reshuffling at each epoch boundary (like a DistributedSampler with
    ``drop_last=False``, but resumable mid-epoch). A row, not its text, names a prompt: its metadata goes with it.
    """

    def __init__(self, num_rows: int, seed: int) -> None:
        self.num_rows = num_rows
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.position = 0
        self._order = torch.randperm(num_rows, generator=self.generator)

    def sample(self, num_prompts: int) -> list[int]:
        chosen: list[int] = []
        while len(chosen) < num_prompts:
            if self.position == len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = torch.randperm(self.num_rows, generator=self.generator)
            take = min(num_prompts - len(chosen), len(self._order) - self.position)
            chosen += self._order[self.position:self.position + take].tolist()
            self.position += take
        return chosen

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "epoch": self.epoch, "position": self.position,
                "order": self._order.clone(), "num_prompts": self.num_rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_prompts"] != self.num_rows:
            raise ValueError(f"prompt sampler state is for {state['num_prompts']} prompts, the dataset has "
                             f"{self.num_rows} (different dataset?)")
        self.generator.set_state(state["generator"])
        self.epoch, self.position, self._order = state["epoch"], state["position"], state["order"].clone()

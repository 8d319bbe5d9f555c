"""Fuzz campaign (hypothesis, derandomized, bounded) for the parsers of files and text users hand rlrunner: prompt
files (.txt / .jsonl / .parquet: any unicode, line endings, BOMs, duplicates, metadata) and recipe overrides on the
command line. Each input either loads to what it says or fails with one line naming the problem (ValueError /
TypeError / RecipeError); never a traceback of another kind. Each test prints how many inputs it tried."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlrunner.config.errors import RecipeError
from rlrunner.data.prompts import PromptSet, load_prompt_set
from rlrunner.recipe import load_recipe

# fixed inputs (derandomize), bounded counts, no example database: the same campaign on every machine
CAMPAIGN = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
# CI runs each target's bounded count; RLRUNNER_FUZZ_SCALE=10 runs ten times as many inputs (docs/security.md)
SCALE = float(os.environ.get("RLRUNNER_FUZZ_SCALE", "1"))


def budget(max_examples: int) -> settings:
    return settings(CAMPAIGN, max_examples=max(1, round(max_examples * SCALE)))

# any character a UTF-8 file can hold (no lone surrogates); line breaks and the BOM are drawn separately
TEXT = st.characters(blacklist_categories=("Cs",))
LINE_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=40)
NEWLINES = st.sampled_from(["\n", "\r\n", "\r"])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(TEXT, max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(TEXT, max_size=5), inner, max_size=3),
    max_leaves=8)


@contextmanager
def counting(capsys: pytest.CaptureFixture, target: str) -> Iterator[SimpleNamespace]:
    """Counts a target's inputs (``.count``) and prints the figure at the end of its test (quoted in
    docs/security.md)."""
    tried = SimpleNamespace(count=0)
    try:
        yield tried
    finally:
        with capsys.disabled():
            print(f"\nfuzz: {target}: {tried.count} inputs tried")


def _one_line_error(call, *types: type[Exception]) -> str | None:
    """``call()``'s error message (a one-line ValueError/TypeError/...), or None when it succeeded."""
    try:
        call()
    except types as err:
        assert "\n" not in str(err), str(err)
        return str(err)
    return None


def _write(path: Path, lines: list[str], newlines: list[str], bom: bool) -> Path:
    body = "".join(line + newlines[i % len(newlines)] for i, line in enumerate(lines))
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body.encode("utf-8"))
    return path


def test_txt_prompt_files(tmp_path, capsys):
    with counting(capsys, "prompt .txt (unicode lines, \\n / \\r\\n / \\r, BOM)") as tried:

        @budget(100)
        @given(lines=st.lists(LINE_TEXT, max_size=8), newlines=st.lists(NEWLINES, min_size=1, max_size=3),
               bom=st.booleans())
        def check(lines, newlines, bom):
            tried.count += 1
            file = _write(tmp_path / "p.txt", lines, newlines, bom)
            expected = [line.strip() for line in lines if line.strip()]
            if not expected:
                assert _one_line_error(lambda: load_prompt_set(file, "train"), ValueError).endswith("has no prompts")
                return
            assert load_prompt_set(file, "train") == PromptSet(expected, [{} for _ in expected])

        check()


def test_jsonl_prompt_files(tmp_path, capsys):
    record = st.fixed_dictionaries({"prompt": LINE_TEXT.filter(str.strip)},
                                   optional={"id": st.integers(0, 10), "extra_info": st.dictionaries(
                                       st.sampled_from(["index", "tag"]), JSON_VALUES, max_size=2)})
    with counting(capsys, "prompt .jsonl (records with metadata, repeated prompts, ensure_ascii off, BOM)") as tried:

        @budget(100)
        @given(records=st.lists(record, min_size=1, max_size=6), repeat=st.booleans(), ascii_only=st.booleans(),
               newlines=st.lists(NEWLINES, min_size=1, max_size=3), bom=st.booleans())
        def check(records, repeat, ascii_only, newlines, bom):
            tried.count += 1
            if repeat:  # the first prompt again on another row, with that row's own metadata
                records = [*records, {**records[-1], "prompt": records[0]["prompt"]}]
            lines = [json.dumps(r, ensure_ascii=ascii_only) for r in records]
            file = _write(tmp_path / "p.jsonl", lines, newlines, bom)
            assert load_prompt_set(file, "train") == PromptSet(
                [r["prompt"].strip() for r in records], [{k: v for k, v in r.items() if k != "prompt"} for r in records])

        check()


def test_any_text_as_a_prompt_file(tmp_path, capsys):
    with counting(capsys, "prompt .jsonl / .txt (any bytes)") as tried:

        @budget(200)
        @given(data=st.binary(max_size=200) | st.text(TEXT, max_size=80).map(str.encode),
               suffix=st.sampled_from([".jsonl", ".txt"]))
        def check(data, suffix):
            tried.count += 1
            file = tmp_path / f"any{suffix}"
            file.write_bytes(data)
            _one_line_error(lambda: load_prompt_set(file, "train"), ValueError, TypeError)

        check()


def test_parquet_prompt_files(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -r requirements/loggers.txt)")
    import pyarrow.parquet as pq

    with counting(capsys, "prompt .parquet (unicode prompts, repeated, per-row extra_info.index)") as tried:

        @budget(40)
        @given(prompts=st.lists(st.text(TEXT, max_size=20), min_size=1, max_size=6), repeat=st.booleans())
        def check(prompts, repeat):
            tried.count += 1
            prompts = prompts + prompts[:1] if repeat else prompts
            extra = [{"index": i} for i in range(len(prompts))]
            file = tmp_path / "p.parquet"
            pq.write_table(pa.table({"prompt": prompts, "extra_info": extra}), file)
            if not all(p.strip() for p in prompts):
                assert "not a non-empty text" in _one_line_error(lambda: load_prompt_set(file, "train"), ValueError)
                return
            assert load_prompt_set(file, "train") == PromptSet([p.strip() for p in prompts],
                                                               [{"extra_info": e} for e in extra])

        check()


@pytest.fixture(scope="module")
def recipe_paths(tmp_path_factory) -> list[str]:
    """Prompt files for the tiny recipe, so every override below loads against the same real files."""
    data = tmp_path_factory.mktemp("fuzz-data")
    for split in ("train", "test"):
        (data / f"{split}.txt").write_text('a sign that says "1"\n')
    return [f"env.train.dataset.path={data}", f"env.eval.dataset.path={data}"]


# what a user could type after a key: the YAML-ish grammar OmegaConf reads (quotes, brackets, ${...}) included
OVERRIDE_VALUE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["[", "]", "{", "'", '"', "${", "${runner.seed}", "${oc.env:HOME}", "null", "~", "nan", "-inf", "1e400",
     "0x1F", "[1, 2", "{a: 1}", "true", "\x00", "a: b", "- x"])
SCHEMA_KEYS = ["runner.max_steps", "runner.seed", "actor.optim.lr", "algorithm.nft_tau", "runner.logger.experiment_name",
               "cluster.component_placement", "env.train.dataset.path", "actor.model.tiny.resolution", "runner",
               "actor.model.model_type", "algorithm.group_size", "env.train.reward.model"]


def test_recipe_overrides_on_the_command_line(recipe_paths, capsys):
    key = st.sampled_from(SCHEMA_KEYS) | st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
    with counting(capsys, "recipe overrides key=value (any key, any value)") as tried:

        @budget(15)
        @given(key=key, value=OVERRIDE_VALUE)
        def check(key, value):
            tried.count += 1
            _one_line_error(lambda: load_recipe("tiny_nft_ocr", [*recipe_paths, f"{key}={value}"]), RecipeError)

        check()


def test_typed_override_values_arrive_as_typed(recipe_paths, capsys):
    word = st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,15}", fullmatch=True).filter(
        lambda w: w.lower() not in {"true", "false", "null", "yes", "no", "on", "off", "nan", "inf"})
    with counting(capsys, "recipe overrides with a valid typed value (int, float, name)") as tried:

        @budget(5)
        @given(steps=st.integers(1, 10**6), lr=st.floats(1e-8, 10.0), name=word)
        def check(steps, lr, name):
            tried.count += 1
            cfg = load_recipe("tiny_nft_ocr", [*recipe_paths, f"runner.max_steps={steps}", f"actor.optim.lr={lr!r}",
                                               f"runner.logger.experiment_name={name}"])
            assert cfg.runner.max_steps == steps and math.isclose(cfg.actor.optim.lr, lr, rel_tol=0, abs_tol=0)
            assert cfg.runner.logger.experiment_name == name

        check()

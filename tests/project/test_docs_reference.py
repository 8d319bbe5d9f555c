"""The generated reference pages (docs/reference/keys.md, docs/reference/cli.md) are what scripts/reference_docs.py
writes from the schema and the commands now, and the key page says what the acceptance of issue 42 asks of it."""

from __future__ import annotations

import json
import subprocess
import sys

from docs_helpers import ROOT

from rlrunner.commands.keys import schema_keys

KEYS_PAGE = ROOT / "docs" / "reference" / "keys.md"
SCRIPT = ROOT / "scripts" / "reference_docs.py"


def test_checked_in_references_are_the_generated_ones():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-6000:]


def _rows() -> dict[str, list[str]]:
    rows = {}
    for line in KEYS_PAGE.read_text().splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").replace(r"\|", "\0").split("|")]
            rows[cells[0].strip("`")] = [cell.replace("\0", "|") for cell in cells]
    return rows


def test_every_leaf_key_is_in_the_reference_with_its_meaning_and_default():
    rows = _rows()
    keys = schema_keys()
    assert sorted(key.name for key in keys) == sorted(rows), "the page's keys are not the schema's leaf keys"
    for key in keys:
        assert rows[key.name][2] == f"`{json.dumps(key.default)}`", key.name
        assert key.meaning and rows[key.name][3].replace("&lt;", "<").startswith(key.meaning), key.name
        if key.allowed:  # a choice's names are written as code
            assert "*Allowed:* " in rows[key.name][3], key.name
    assert "learning rate" in rows["actor.optim.lr"][3].lower()


def _rlinf(rows: dict[str, list[str]], key: str) -> str:
    meaning = rows[key][3]
    return meaning.split("*RLinf:* ", 1)[1] if "*RLinf:* " in meaning else ""


def test_rlinf_spellings_and_recipes_are_listed():
    rows = _rows()
    # RLinf keys that set ours (rlrunner/config/rlinf.py MAPPED) and renamed RLinf values (VALUES)
    assert "`actor.fsdp_config.strategy`" in _rlinf(rows, "actor.strategy")
    assert "`actor.enable_offload`" in _rlinf(rows, "cluster.enable_offload")
    assert "`algorithm.loss_type`" in _rlinf(rows, "algorithm.name")
    assert "`actor.fsdp_config.gradient_checkpointing`" in _rlinf(rows, "actor.model.sd3.gradient_checkpointing")
    assert "visual.ocr_dataset" in _rlinf(rows, "env.train.dataset.type")
    # the shipped recipes that set a key: tiny_nft_ocr_remote's reward url, every recipe's group size
    assert "tiny_nft_ocr_remote" in rows["env.train.reward.url"][4].split(", ")
    assert rows["algorithm.group_size"][4] == "all"

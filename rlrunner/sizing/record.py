"""The record of full-size simulations (``bench/simulated_recipes.json``): which recipe and model folder an entry
simulated, so that a changed recipe, schema default or folder shows as a stale entry instead of passing on old
numbers.

``bench/simulate_recipes.py --out`` writes the record (minutes per recipe); ``tests/sizing/test_plan_vs_simulation.py``
holds the formula's plan and the recipes' fit to it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def recipe_fingerprint(cfg: Any, folder: Path, root: Path) -> str:
    """A short hash of the resolved recipe ``cfg`` (every key, the schema's defaults included; paths under the
    checkout ``root`` written relative to it, so another clone hashes alike) and of every config file of the
    model ``folder``."""
    digest = hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).replace(str(root), "<root>").encode())
    for path in sorted(folder.rglob("*.json")):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def read_record(path: Path) -> dict[str, dict]:
    """The record's entries by recipe name (an empty record where the file does not exist)."""
    return json.loads(path.read_text()) if path.exists() else {}

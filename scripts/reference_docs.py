"""The generated reference pages of the docs site: docs/reference/keys.md (every recipe key) and docs/reference/cli.md
(every command's ``--help``).

    .venv/bin/python scripts/reference_docs.py --write   # regenerate both pages after changing a key or a command
    .venv/bin/python scripts/reference_docs.py --check   # exit 1 naming the stale pages (tests/project/test_docs_reference.py)

The key page reads the schema as ``bin/rlrunner keys`` does (:func:`rlrunner.commands.keys.schema_keys`: type,
default, allowed values, the comment beside the field) and adds, per key, its RLinf spelling (from the tables of
:mod:`rlrunner.config.rlinf`) and the shipped recipes (examples/diffusion/config/*.yaml) that set it.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from omegaconf import DictConfig, OmegaConf

from rlrunner.commands.keys import Key, schema_keys
from rlrunner.config import rlinf
from rlrunner.config.checks import table_key
from rlrunner.config.compose import compose
from rlrunner.config.errors import RecipeError
from rlrunner.config.loader import available_recipes, recipe_path
from rlrunner.models.families import family_settings
from rlrunner.recipe import RecipeConfig

KEYS_PAGE = ROOT / "docs" / "reference" / "keys.md"
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
# what `bin/rlrunner <command> --help` is asked for; tensorboard, ray and python are other programs' own help
COMMANDS = ("", "train", "plan", "keys", "export", "serve_reward")
# those bin/rlrunner runs as `python -m rlrunner.commands.<command>`
PYTHON_COMMANDS = ("plan", "keys", "export", "serve_reward")
# values tried on each RLinf key that sets ours, to learn which of our keys it sets (a wrong value is refused)
PROBE_VALUES: tuple[Any, ...] = (True, "fsdp2", "full_shard", "bf16", "embodied_nft")


def _probe_lookup(key: str) -> Any:
    # the family a family key lands in is the placeholder itself: actor.model.<family>.gradient_checkpointing
    return "<family>" if key == "actor.model.model_type" else rlinf._MISSING


def rlinf_spellings() -> dict[str, list[str]]:
    """``our table key -> [RLinf spellings]``: RLinf keys that set it (``MAPPED``) and RLinf values renamed to its
    values (``VALUES``). A key RLinf spells as we do is not listed: it passes unchanged."""
    spellings: dict[str, list[str]] = {}
    for theirs, move in rlinf.MAPPED.items():
        ours: dict[str, None] = {}
        for value in PROBE_VALUES:
            try:
                ours.update(dict.fromkeys(key for key, _ in move(theirs, value, _probe_lookup)))
            except RecipeError:
                continue
        for key in ours:
            spellings.setdefault(key, []).append(f"`{theirs}`")
    for key, renames in rlinf.VALUES.items():
        values = ", ".join(f"`{json.dumps(old)}` → `{json.dumps(new)}`" for old, new in renames.items())
        spellings.setdefault(key, []).append(f"values {values}")
    return spellings


def _set_keys(node: Any, sections: set[str], prefix: str = "") -> Iterator[str]:
    for name, value in node.items():
        dotted = f"{prefix}{name}"
        if isinstance(value, dict) and dotted in sections:
            yield from _set_keys(value, sections, f"{dotted}.")
        else:
            yield dotted


def recipes_setting(keys: list[Key]) -> dict[str, list[str]]:
    """``key -> [recipe stems]``: the shipped recipes whose composed YAML (RLinf keys translated) sets the key."""
    sections = {key.name.rsplit(".", n)[0] for key in keys for n in range(1, key.name.count(".") + 1)}
    schema: DictConfig = OmegaConf.structured(RecipeConfig)
    families = list(family_settings())
    setting: dict[str, list[str]] = {}
    for stem in available_recipes():
        layer, _ = rlinf.translate(compose(recipe_path(stem)), schema, families, source=stem)
        for key in _set_keys(OmegaConf.to_container(layer), sections):
            setting.setdefault(key, []).append(stem)
    return setting


def _cell(text: str) -> str:
    """``text`` in a Markdown table cell that GitHub and mkdocs render alike: pipes escaped, ``<`` outside code spans
    written as an entity (``<family>`` is not an HTML tag)."""
    parts = text.replace("|", r"\|").split("`")
    return "`".join(part if index % 2 else part.replace("<", "&lt;") for index, part in enumerate(parts))


def _allowed_cell(allowed: str) -> str:
    """A choice's names as code (the empty name as ``""``): ``one of a | b`` -> ``one of `a`, `b```."""
    for lead in ("each one of ", "one of "):
        if allowed.startswith(lead):
            names = allowed.removeprefix(lead).split(" | ")
            return lead + ", ".join(f"`{name}`" if name.strip() else '`""`' for name in names)
    return allowed


def _group(name: str, families: set[str]) -> str:
    parts = name.split(".")
    if parts[:2] == ["actor", "model"] and len(parts) > 3 and parts[2] in families:
        return ".".join(parts[:3])
    return parts[0]


def keys_page() -> str:
    keys = schema_keys()
    families = set(family_settings())
    spellings, setting = rlinf_spellings(), recipes_setting(keys)
    recipes = available_recipes()
    lines = ["# Recipe keys", "",
             "<!-- generated by scripts/reference_docs.py --write from the schema; do not edit by hand -->", "",
             (f"Every leaf key of the recipe schema ({len(keys)} keys), as `bin/rlrunner keys [prefix]` prints them: "
             "its type, default and meaning (the comment beside the field in `rlrunner/config/schema.py` or "
             "`rlrunner/models/settings.py`), then the values its check allows. *RLinf:* names the RLinf keys that "
             "set it and RLinf values renamed to ours; an RLinf key spelt as ours passes unchanged and is not listed. "
             f"*Set by* lists the shipped recipes (`examples/diffusion/config/`, {len(recipes)} recipes) that set "
             "the key; the others take the default."), ""]
    groups: dict[str, list[Key]] = {}
    for key in keys:
        groups.setdefault(_group(key.name, families), []).append(key)
    for group, members in groups.items():
        lines += [f"## {group}", "", "| key | type | default | meaning | set by |", "|---|---|---|---|---|"]
        for key in members:
            setters = setting.get(key.name, [])
            others = [stem for stem in recipes if stem not in setters]
            set_by = ("all" if not others else "all but " + ", ".join(others) if len(others) < len(setters)
                      else ", ".join(setters))
            extras = [f"*Allowed:* {_allowed_cell(key.allowed)}."] if key.allowed else []
            if spelling := spellings.get(table_key(key.name, families)):
                extras.append(f"*RLinf:* {'; '.join(spelling)}.")
            meaning = " ".join([key.meaning + ("." if extras and not key.meaning.endswith(".") else "")] + extras)
            row = [f"`{key.name}`", f"`{key.kind}`", f"`{json.dumps(key.default)}`", meaning, set_by]
            lines.append("| " + " | ".join(_cell(item) for item in row) + " |")
        lines.append("")
    return "\n".join(lines)


def help_text(command: str) -> str:
    """``bin/rlrunner <command> --help`` as a fresh shell prints it (100 columns, whatever the terminal). The commands
    bin/rlrunner hands to Python (:data:`PYTHON_COMMANDS`) print their parser's help from this process: the same
    text, without a fresh interpreter importing torch and diffusers for each."""
    if command in PYTHON_COMMANDS:
        out = io.StringIO()
        with mock.patch.dict(os.environ, {"COLUMNS": "100"}), contextlib.redirect_stdout(out):
            try:
                code = importlib.import_module(f"rlrunner.commands.{command}").main(["--help"])
            except SystemExit as done:  # argparse's --help
                code = done.code
        if code not in (0, None):
            raise SystemExit(f"bin/rlrunner {command} --help failed ({code})")
        return out.getvalue().rstrip()
    argv = [str(ROOT / "bin" / "rlrunner")] + ([command, "--help"] if command else ["--help"])
    env = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[1:])} --help failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.rstrip()


def cli_page() -> str:
    lines = ["# Command line", "",
             "<!-- generated by scripts/reference_docs.py --write from each command's --help; do not edit by hand -->",
             "",
             ("Every command of `bin/rlrunner` with its `--help`. `bin/rlrunner tensorboard`, `ray` and `python` run "
             "TensorBoard, Ray's command line and Python of the environment rlrunner uses: their `--help` is their "
             "own."), ""]
    for command in COMMANDS:
        title = f"bin/rlrunner {command}".strip()
        lines += [f"## {title}", "", "```text", f"$ {title} --help", help_text(command), "```", ""]
    return "\n".join(lines)


PAGES = {KEYS_PAGE: keys_page, CLI_PAGE: cli_page}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="write the pages")
    action.add_argument("--check", action="store_true", help="exit 1 if a checked-in page differs from a fresh one")
    args = parser.parse_args(argv)
    stale = []
    for page, make in PAGES.items():
        fresh = make()
        old = page.read_text() if page.exists() else ""
        if args.write and fresh != old:
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(fresh)
            print(f"wrote {page.relative_to(ROOT)}")
        elif args.check and fresh != old:
            diff = difflib.unified_diff(old.splitlines(), fresh.splitlines(), "checked in", "generated", lineterm="")
            stale.append(f"{page.relative_to(ROOT)} is stale:\n" + "\n".join(list(diff)[:40]))
    if stale:
        print("\n".join(stale) + "\nregenerate: .venv/bin/python scripts/reference_docs.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every recipe key: ``bin/rlrunner keys [prefix]``.

Prints each leaf key of the recipe schema (:data:`rlrunner.recipe.RecipeConfig`, the model families' sections
included) under ``prefix`` with its type, its default, the values its check allows (the key's entry in
:data:`rlrunner.recipe.KEY_CHECKS`: a choice's names, a range's bounds) and its meaning. A key's meaning is the
comment beside its field in the dataclass that declares it (rlrunner/config/schema.py,
rlrunner/models/settings.py): the comment lines right above the field, then a comment at the end of its line; a
family's settings type that only changes a default keeps the shared field's meaning. An unknown prefix is one line
naming the nearest keys, exit status 2.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import functools
import inspect
import json
import os
import sys
import tokenize
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlrunner.config.check_kinds import Check, Choice, Each, Range, Rule
from rlrunner.config.checks import key_check
from rlrunner.models.families import family_settings
from rlrunner.recipe import KEY_CHECKS, RecipeConfig

EXIT_USER_ERROR = 2


@dataclasses.dataclass(frozen=True)
class Key:
    """One leaf key of the schema: ``name`` dotted (``actor.optim.lr``), its declared ``kind`` (``float``), its
    ``default``, what its check allows (``""``: the type is the contract) and its one-line ``meaning``."""

    name: str
    kind: str
    default: Any
    allowed: str
    meaning: str


@functools.cache
def _comments(path: str) -> tuple[dict[int, str], dict[int, str]]:
    """The comments of a source file by line number: ``(comment-only lines, comments ending a line of code)``."""
    own, trailing = {}, {}
    with open(path, encoding="utf-8") as source:
        for token in tokenize.generate_tokens(source.readline):
            if token.type == tokenize.COMMENT:
                (number, column), text = token.start, token.string.removeprefix("#").strip()
                (own if not token.line[:column].strip() else trailing)[number] = text
    return own, trailing


@functools.cache
def _field_lines(cls: type) -> dict[str, tuple[int, int]]:
    """``field name -> (first line, last line)`` of each field ``cls`` itself declares, in its module's file."""
    try:
        path = inspect.getsourcefile(cls)
        tree = ast.parse(Path(path).read_text()) if path else None
    except (OSError, TypeError):  # a class made by make_dataclass (rlrunner.recipe) has no source of its own
        return {}
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return {item.target.id: (item.lineno, item.end_lineno or item.lineno) for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
    return {}


def field_meaning(cls: type, name: str) -> str:
    """The meaning of field ``name`` of dataclass ``cls``: the comment lines right above it and the comment ending its
    line, in the first class of the MRO that declares the field with one ("" if none does)."""
    for owner in cls.__mro__:
        lines = _field_lines(owner).get(name)
        if lines is None:
            continue
        own, trailing = _comments(inspect.getsourcefile(owner))
        above, number = [], lines[0] - 1
        while number in own:
            above.insert(0, own[number])
            number -= 1
        parts = above + [trailing[n] for n in range(lines[0], lines[1] + 1) if n in trailing]
        if parts:
            return " ".join(parts)
    return ""


def _kind(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _allowed(check: Check) -> str:
    if isinstance(check, Choice):
        return "one of " + " | ".join(str(name) for name in check.names())
    if isinstance(check, Each):
        return "each one of " + " | ".join(str(name) for name in check.check.names())
    if isinstance(check, Range):
        return check.allowed()
    if isinstance(check, Rule):
        return check.allowed
    return ""


def _walk(config: Any, prefix: str) -> Iterator[tuple[str, type, str, Any]]:
    """``(dotted key, declaring dataclass, field name, default)`` of every leaf under the dataclass ``config``."""
    hints = typing.get_type_hints(type(config))
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if dataclasses.is_dataclass(value):
            yield from _walk(value, f"{prefix}{item.name}.")
        else:
            yield f"{prefix}{item.name}", type(config), _kind(hints[item.name]), value


def schema_keys() -> list[Key]:
    """Every leaf key of the recipe schema, in schema order."""
    families = list(family_settings())
    return [Key(name, kind, default, _allowed(key_check(name, families, KEY_CHECKS)),
                field_meaning(cls, name.rsplit(".", 1)[-1])) for name, cls, kind, default in _walk(RecipeConfig(), "")]


def under(keys: list[Key], prefix: str) -> list[Key]:
    """The keys named ``prefix`` or in the section ``prefix`` (``actor.optim``: ``actor.optim.lr``, ...)."""
    prefix = prefix.strip(".")
    return [key for key in keys if not prefix or key.name == prefix or key.name.startswith(f"{prefix}.")]


def nearest(keys: list[Key], prefix: str) -> list[str]:
    """The sections and keys whose dotted names are closest to ``prefix``."""
    names = {".".join(key.name.split(".")[:depth]) for key in keys for depth in range(1, key.name.count(".") + 2)}
    return difflib.get_close_matches(prefix, sorted(names), n=3, cutoff=0.5)


def render(key: Key) -> list[str]:
    allowed = f"  ({key.allowed})" if key.allowed else ""
    return [f"{key.name}: {key.kind} = {json.dumps(key.default)}{allowed}", f"    {key.meaning}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bin/rlrunner keys", description=__doc__.splitlines()[0])
    parser.add_argument("prefix", nargs="?", default="", help="a section (actor.optim) or key; default: every key")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    keys = schema_keys()
    chosen = under(keys, args.prefix)
    if not chosen:
        close = nearest(keys, args.prefix)
        sections = dict.fromkeys(key.name.split(".")[0] for key in keys)
        hint = f"nearest: {', '.join(close)}" if close else f"sections: {', '.join(sections)}"
        print(f"rlrunner: error: no recipe key {args.prefix!r} ({hint})", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        print("\n".join(line for key in chosen for line in render(key)), flush=True)
    except BrokenPipeError:  # `bin/rlrunner keys | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())

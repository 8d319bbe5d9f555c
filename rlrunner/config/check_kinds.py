"""The kinds of check a recipe key can have (each component's ``KEY_CHECKS`` table gives each of its keys one, e.g.
:data:`rlrunner.rewards.checks.KEY_CHECKS`): each returns None for a good value, or the end of a one-line error (what
is allowed). Also the common ranges, the names a ``Choice`` offers, and the signature of a cross-key check."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig


@dataclass(frozen=True)
class Context:
    base_dir: Path  # anchors relative paths
    check_datasets: bool = True  # False: the prompt files are not read (rlrunner.commands.plan reads none)
    # what a cross-key check resolved for the checks after it, by name: "guidance", the model's Guidance
    # (rlrunner.models.checks.check_model_family; read by rlrunner.objectives.checks.check_flow_grpo)
    resolved: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Free:
    """The schema's declared type (bool, free text) is the whole contract; OmegaConf enforces it on merge."""

    why: str

    def problem(self, value: Any, ctx: Context) -> str | None:
        return None


@dataclass(frozen=True)
class Elsewhere:
    """Checked together with other keys by the named cross-key check of the component that reads the key."""

    where: str

    def problem(self, value: Any, ctx: Context) -> str | None:
        return None


@dataclass(frozen=True)
class Choice:
    """One of the names a registry holds (``names`` is called at check time)."""

    names: Callable[[], Iterable[str]]

    def problem(self, value: Any, ctx: Context) -> str | None:
        valid = list(self.names())
        if value in valid:
            return None
        close = difflib.get_close_matches(str(value), [v for v in valid if v], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"is not valid{hint}; choose one of {valid}"


@dataclass(frozen=True)
class Each:
    """Every item of a list passes ``check``."""

    check: Choice

    def problem(self, value: Any, ctx: Context) -> str | None:
        for item in value:
            if (why := self.check.problem(item, ctx)) is not None:
                return f"has item {item!r} that {why}"
        return None


@dataclass(frozen=True)
class Range:
    """A finite number within [low, high] (open ends with ``low_open``/``high_open``); None only if ``optional``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False
    meaning: str = ""  # what the bounds protect, for the message

    def allowed(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        text = "a number " + " and ".join(parts) + (" or null" if self.optional else "")
        return text + (f" ({self.meaning})" if self.meaning else "")

    def problem(self, value: Any, ctx: Context) -> str | None:
        if value is None and self.optional:
            return None
        bad = value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        bad = bad or (self.low is not None and (value <= self.low if self.low_open else value < self.low))
        bad = bad or (self.high is not None and (value >= self.high if self.high_open else value > self.high))
        return f"must be {self.allowed()}" if bad else None


@dataclass(frozen=True)
class Rule:
    """A predicate of the value alone, and what it allows in words."""

    ok: Callable[[Any], bool]
    allowed: str

    def problem(self, value: Any, ctx: Context) -> str | None:
        return None if self.ok(value) else f"must be {self.allowed}"


@dataclass(frozen=True)
class InPathTable:
    """A file or folder: resolved, and checked where it is read, by the one path table
    (:data:`rlrunner.config.paths.PATH_KEYS`), which tests/config/test_paths.py keeps in step with these entries."""

    what: str

    def problem(self, value: Any, ctx: Context) -> str | None:
        return None


Check = Free | Elsewhere | Choice | Each | Range | Rule | InPathTable


def names(registry: Iterable[str], *, first: tuple[str, ...] = ()) -> Callable[[], list[str]]:
    """The names of a registry (a dict or tuple), read when a recipe is checked: a registry that fills as its
    modules register (rewards) offers every name by then."""
    return lambda: [*first, *registry]


def fixed(*choices: str) -> Callable[[], Iterable[str]]:
    """Keys whose only consumer takes these names (no registry of their own)."""
    return lambda: choices


POSITIVE_INT = Range(low=1)
COUNT = Range(low=0)  # 0 = off / none, where the key's comment says so
SEED = Range(low=0, high=2**32 - 1, meaning="numpy and torch seeds")
UNIT_OPEN = Range(low=0, high=1, high_open=True)

CrossCheck = Callable[[DictConfig, Context], None]
"""A check across keys: raises :class:`~rlrunner.config.errors.RecipeError` with one line, or returns."""

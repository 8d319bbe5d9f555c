"""The one error type of recipe problems, in a module of its own so that the loader and the checks (which
both raise it) do not import each other."""

from typing import NoReturn


class RecipeError(ValueError):
    """A recipe problem the user can fix; the message is one line saying what to change."""


def fail(message: str) -> NoReturn:
    """Stop the recipe with ``message`` (one line: the key, the bad value, what to change)."""
    raise RecipeError(message)

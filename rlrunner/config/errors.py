"""The one error type of recipe problems, in a module of its own so that the loader and the validator (which
both raise it) do not import each other."""


class RecipeError(ValueError):
    """A recipe problem the user can fix; the message is one line saying what to change."""

"""The recipe: its typed schema (``schema.py``), loading a recipe with its overrides (``loader.py``,
``compose.py``, RLinf's spelling in ``rlinf.py``), the paths it names (``paths.py``), one check per key
(``checks.py`` with the kinds of check in ``check_kinds.py``, the model folder's checks in ``model_checks.py``),
the cross-key validation run before any worker starts (``validate.py``) and the error a user sees
(``errors.py``: one line, the key, what was expected).

May import: rlrunner.algorithms, rlrunner.cluster, rlrunner.data, rlrunner.models, rlrunner.rewards,
rlrunner.sizing, rlrunner.tracking
"""

"""The recipe: its typed schema (``schema.py``), loading a recipe with its overrides (``loader.py``,
``compose.py``, RLinf's spelling in ``rlinf.py``), the paths it names (``paths.py``), the machinery of the checks
(the kinds of check in ``check_kinds.py``; walking a recipe's leaves and running the per-key tables in
``checks.py``) and the error a user sees (``errors.py``: one line, the key, what was expected). The checks
themselves live with the component that reads each key (``rlrunner/<component>/checks.py``), registered in
:mod:`rlrunner.recipe`, so this package imports none of them.

May import: nothing of rlrunner
"""

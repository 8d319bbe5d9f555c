"""rlrunner: online reinforcement fine-tuning of flow-matching diffusion models (DiffusionNFT, FlowGRPO, AWM).

Data flows one way, and a package imports only from the packages its docstring names under "May import": recipe
(``config``) → placement (``cluster``, over the torch engines of ``distributed``) → workers (``workers``, over
``models``, ``objectives``, ``rewards``, ``data``) → the run (``run``, moving what ``step`` defines) → pure math
(``algorithms``) → reports (``tracking``).
``commands`` holds what a user runs; ``sizing`` answers "will it fit?"; ``utils`` serves every layer. Each component
checks the recipe keys it reads (its ``checks.py``), and ``recipe.py`` runs them all, in order. docs/layout.md
lists every module, generated from these docstrings (``bin/rlrunner python scripts/layout.py --write``).
Other packages add model families and rewards through the entry point groups ``rlrunner.model_families`` and
``rlrunner.rewards`` (docs/families/index.md "A family or a reward from your own package").
"""

"""The commands a user runs, each a thin ``main()`` over the library: ``train`` (the launcher's entry point,
``bin/rlrunner train``), ``plan`` (will it fit?), ``keys`` (every recipe key with its default and meaning),
``export`` (a checkpoint's LoRA adapter, with a card) and ``serve_reward`` (any registered reward over HTTP). Each
parses its arguments, turns a user's mistake into one line and an exit status, and calls the packages below; no
other package imports a command.

May import: rlrunner.algorithms, rlrunner.cluster, rlrunner.config, rlrunner.models, rlrunner.objectives,
rlrunner.recipe, rlrunner.rewards, rlrunner.run, rlrunner.sizing, rlrunner.tracking, rlrunner.utils
"""

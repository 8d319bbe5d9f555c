"""Memory and data-plane sizing from a model folder's config files alone (no weights read): ``rlrunner.commands.plan``
and ``bench/data_plane.py`` print what these modules compute; ``plan --simulate`` runs the recipe's step at full
size on fake tensors (``simulate``: the phases; ``fake_build``: the model; ``tracker``: the bytes; ``sim_report``:
per device, JSON, the FLOPs prediction).

May import: rlrunner.cluster, rlrunner.distributed, rlrunner.models, rlrunner.objectives, rlrunner.rewards,
rlrunner.step, rlrunner.utils, rlrunner.workers
"""

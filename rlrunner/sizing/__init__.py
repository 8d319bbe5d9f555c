"""Memory and data-plane sizing from a model folder's config files alone (no weights read): ``rlrunner.commands.plan``
and ``bench/data_plane.py`` print what these modules compute.

May import: rlrunner.models, rlrunner.objectives, rlrunner.rewards, rlrunner.utils
"""

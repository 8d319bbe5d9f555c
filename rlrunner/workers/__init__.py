"""The three kinds of worker, as plain classes whose public methods are the whole remote surface: rollout (samples with
the EMA policy), reward (``reward.py``, the placement's ``env`` component: decodes and scores), actor (the update, EMA
and adapter exports). They know nothing of Ray: ``rlrunner.cluster`` places and calls them. The checks of the actor's
batch and optimizer keys are in ``checks.py``.

May import: rlrunner.algorithms, rlrunner.config, rlrunner.distributed, rlrunner.models, rlrunner.objectives,
rlrunner.rewards, rlrunner.step, rlrunner.utils
"""

"""Prompt datasets: a folder with ``train.txt`` / ``test.txt``, a file, or a parquet table, and the seeded prompt
sampler whose position a checkpoint saves; the checks of the prompt-set keys (``checks.py``: each split's file
there and readable, with GenEval records where the split's reward is GenEval).

May import: rlrunner.config, rlrunner.rewards
"""

"""Prompt datasets: a folder with ``train.txt`` / ``test.txt``, a file, or a parquet table, and the seeded prompt
sampler whose position a checkpoint saves.

May import: nothing of rlrunner
"""

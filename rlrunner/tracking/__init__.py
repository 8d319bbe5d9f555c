"""What a run reports: one logger interface over TensorBoard, ``metrics.jsonl`` and sample files
(``logger.py``), the experiment trackers wandb, swanlab and mlflow behind it (``backends.py``), and the console: a
line per step, the line before each eval and the closing summary (``console.py``); the checks of the logger's keys
(``checks.py``).

May import: rlrunner.config
"""

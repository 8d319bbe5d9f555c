"""What moves in a training step, and who gets which part: the one batch type that travels between workers
(``batch.py``), the per-step data plane (``data_plane.py``), how the driver divides prompts and samples over rounds,
workers and scorer threads (``shares.py``), which samples each actor rank trains on with what noise
(``sample_order.py``), collocated components taking turns on their devices (``device_turns.py``), and the sizes of
a step, derived once and checked against the placement (``sizes.py``, ``checks.py``).

May import: rlrunner.cluster, rlrunner.config, rlrunner.utils
"""

"""Small helpers every layer may use, none of which knows a recipe: device and precision, derived seeds,
sharded-tensor helpers, durable (fsynced) writes, thread counts, number formatting, registry lookups by dotted name.

May import: nothing of rlrunner
"""

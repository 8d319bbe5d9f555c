"""The torch engines workers train and sample with: a process group per worker group (``process_group.py``: the
environment a worker needs and :func:`init_distributed`), the actor's data-parallel engines, DDP and FSDP2
(``parallelize.py``), and context parallelism over a device mesh through diffusers' ``_cp_plan`` hooks
(``context_parallel.py``); the checks of their keys (``checks.py``). Nothing here knows Ray: the cluster
(:mod:`rlrunner.cluster`) starts the processes, sets their environment and calls the workers.

May import: rlrunner.config, rlrunner.utils
"""

"""A run and its lifecycle: the training loop (``runner.py``, the single controller), what outlives a lost worker
(``supervisor.py``, with the pure restart bookkeeping of ``recovery.py``), preemption on a signal
(``preemption.py``), how a run ended (``outcome.py``: the trackers' status, the exit status and its last line),
checkpoints on disk (``checkpoint.py``), which checkpoint a resume, a restart or an export takes
(``checkpoint_index.py``), the run's checkpointer with every rule of whether a recipe may resume a checkpoint
(``checkpointer.py``), what the driver logs besides scalars (``run_logging.py``), which adapters the rollout
holds and the weight sync that sends them (``weight_sync.py``), the reward-hacking watch (``watch.py``) and the
checks of the run's keys (``checks.py``).

May import: rlrunner.algorithms, rlrunner.cluster, rlrunner.config, rlrunner.data, rlrunner.models,
rlrunner.objectives, rlrunner.rewards, rlrunner.step, rlrunner.tracking, rlrunner.utils, rlrunner.workers
"""

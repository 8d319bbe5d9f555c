"""Which LoRA adapters the driver sends the rollout workers, and when: a method of
:class:`~rlrunner.run.runner.Runner`, which holds the state (the step, the last sync's adapters and step, the
worker groups).

A sync sends only the adapter the training rollout samples with (NFT: ``ema``, its old policy; FlowGRPO and AWM:
``default``, on-policy), one flat buffer per adapter (:mod:`rlrunner.utils.flat_state`: under FSDP2 one
all-gather, not one per LoRA tensor). The eval samples the trained adapter: it is sent for the eval only where the
rollout does not hold this step's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rlrunner.models import TRAINED_ADAPTER
from rlrunner.objectives import objective_class


class WeightSync:
    """The weight sync methods of :class:`~rlrunner.run.runner.Runner`."""

    def sync_weights(self) -> None:
        """Send the LoRA tensors (never base weights) of the training rollout's adapter to every rollout worker."""
        sampling_adapter = objective_class(self.cfg.algorithm.name).sampling_adapter
        # all actor ranks gather (FSDP2: one all-gather per adapter), rank 0 returns
        self.rollout_adapters = self.turns.actor_call("lora_weights", (sampling_adapter,), True)[0]
        self.rollout.call("sync_weights", self.rollout_adapters)
        self.synced_step = self.step

    @contextlib.contextmanager
    def trained_adapter_on_rollout(self) -> Iterator[None]:
        """The rollout workers hold this step's trained adapter in the block (the eval samples it).

        Sent unless this step's sync carried it; between weight syncs (``runner.weight_sync_interval > 1``) a
        rollout that trains with that adapter gets the last sync's back after the block, so that training rollouts
        go on with it until the next sync.
        """
        stale = self.synced_step != self.step
        if stale or TRAINED_ADAPTER not in self.rollout_adapters:
            self.rollout.call("sync_weights", self.turns.actor_call("lora_weights", (TRAINED_ADAPTER,), True)[0])
        yield
        if stale and TRAINED_ADAPTER in self.rollout_adapters:
            self.rollout.call("sync_weights", {TRAINED_ADAPTER: self.rollout_adapters[TRAINED_ADAPTER]})

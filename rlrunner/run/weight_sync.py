"""Which LoRA adapters the rollout workers hold, and sending them: a component of
:class:`~rlrunner.run.runner.Runner` with its own state (the last sync's adapters and step).

A sync sends only the adapter the training rollout samples with (NFT: ``ema``, its old policy; FlowGRPO and AWM:
``default``, on-policy), one flat buffer per adapter (:mod:`rlrunner.utils.flat_state`: under FSDP2 one
all-gather, not one per LoRA tensor). The eval samples the trained adapter: it is sent for the eval only where the
rollout does not hold this step's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rlrunner.models import TRAINED_ADAPTER
from rlrunner.step.device_turns import DeviceTurns


class WeightSync:
    """Sends the actor's adapters to the rollout group and remembers what the rollout holds.

    ``turns``: the actor and rollout groups' device turns (every gather of the actor's adapters goes through them);
    ``sampling_adapter``: the adapter the training rollout samples with (the objective's).
    """

    def __init__(self, turns: DeviceTurns, rollout: Any, sampling_adapter: str) -> None:
        self.turns, self.rollout, self.sampling_adapter = turns, rollout, sampling_adapter
        self.adapters: dict[str, Any] = {}  # the last sync's (flat per adapter), as the rollout holds them
        self.synced_step = -1  # the global step whose adapters the last sync sent

    def sync(self, step: int) -> None:
        """Send the LoRA tensors (never base weights) of the training rollout's adapter to every rollout worker."""
        # all actor ranks gather (FSDP2: one all-gather per adapter), rank 0 returns
        self.send(self.turns.actor_call("lora_weights", (self.sampling_adapter,), True)[0])
        self.synced_step = step

    def send(self, adapters: dict[str, Any]) -> None:
        """Hand the rollout workers ``adapters`` (flat per adapter), which they then hold."""
        self.rollout.call("sync_weights", adapters)
        self.adapters = adapters

    @contextlib.contextmanager
    def trained_adapter_on_rollout(self, step: int) -> Iterator[None]:
        """The rollout workers hold global step ``step``'s trained adapter in the block (the eval samples it).

        Sent unless this step's sync carried it; between weight syncs (``runner.weight_sync_interval > 1``) a
        rollout that trains with that adapter gets the last sync's back after the block, so that training rollouts
        go on with it until the next sync.
        """
        stale = self.synced_step != step
        if stale or TRAINED_ADAPTER not in self.adapters:
            self.rollout.call("sync_weights", self.turns.actor_call("lora_weights", (TRAINED_ADAPTER,), True)[0])
        yield
        if stale and TRAINED_ADAPTER in self.adapters:
            self.rollout.call("sync_weights", {TRAINED_ADAPTER: self.adapters[TRAINED_ADAPTER]})

    def state_dict(self, step: int) -> dict[str, Any]:
        """The last sync's step, and its adapters when they are older than global step ``step`` (a resume must not
        sync newer ones before the uninterrupted run would have)."""
        return {"synced_step": self.synced_step,
                "rollout_adapters": self.adapters if self.synced_step != step else None}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Give the rollout what it held at global step ``step`` of the saved run: the saved adapters of a sync that
        the uninterrupted run had not made yet, or this step's."""
        if (held := state.get("rollout_adapters")) is not None:
            self.send(held)
            self.synced_step = state["synced_step"]
        else:
            self.sync(step)

"""Collocated actor and rollout workers taking turns on their devices (``cluster.enable_offload``), and the rule
that every gather of the actor's tensors runs with the actor on its device."""

from __future__ import annotations

from typing import Any


class DeviceTurns:
    """Hands the devices the actor and rollout groups share to one of them, the other waiting in host memory.

    The contract, for every caller of the two groups (the runner):

    - :meth:`hand_to` ``("rollout")`` before a rollout (``generate``), ``("actor")`` before an ``update``;
    - every actor call in :attr:`GATHERING_CALLS` (it gathers or loads adapters or optimizer state, a collective of
      the actor's process group) goes through :meth:`actor_call`, never ``actor.call``: collectives run on the
      device the group was set up for (NCCL has no host-memory path), so the actor must hold the device then;
    - everything else needs no turn: ``ema_update`` is local to each rank, and ``sync_weights`` copies host tensors
      into the rollout's model wherever it is.

    ``enabled``: ``cluster.enable_offload`` with actor and rollout collocated; otherwise nothing moves. Until the
    first hand-over both models are on the device (as built).
    """

    #: actor methods that gather (or load) full adapters or optimizer state on every rank
    GATHERING_CALLS = ("lora_weights", "state_dict", "load_state_dict")

    def __init__(self, actor: Any, rollout: Any, enabled: bool) -> None:
        self.groups = {"actor": actor, "rollout": rollout}
        self.enabled = enabled
        self.holder: str | None = None  # the role that has the device (None: both, at start)

    @classmethod
    def for_placement(cls, actor: Any, rollout: Any, placement: Any, enable_offload: bool) -> DeviceTurns:
        """Turns for ``cluster.enable_offload``: only actor and rollout on the same devices take them."""
        return cls(actor, rollout, enable_offload and placement.is_collocated("actor", "rollout"))

    def hand_to(self, role: str) -> None:
        """Move the other role's model to host memory first, then ``role``'s onto the device."""
        if self.enabled and self.holder != role:
            other = "actor" if role == "rollout" else "rollout"
            self.groups[other].call("offload")
            self.groups[role].call("onload")
            self.holder = role

    def actor_call(self, method: str, *args: Any) -> list[Any]:
        """Call one of :attr:`GATHERING_CALLS` on every actor rank, the actor on its device.

        An actor offloaded for the rollout (an eval right before a save) first gets the device back, the rollout
        leaving it first: one model at a time on the device, one backend per group (a device-mapped
        ``cpu:gloo,cuda:nccl`` group would gather from host memory, over a second and slower transport). The next
        rollout takes the device again. (The worker brings itself back too, ``ActorWorker.on_device``, but next to
        the rollout.)
        """
        assert method in self.GATHERING_CALLS, f"{method!r} does not gather; call the actor group directly"
        if self.holder == "rollout":
            self.hand_to("actor")
        return self.groups["actor"].call(method, *args)

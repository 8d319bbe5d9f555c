"""Collocated actor and rollout workers taking turns on their devices (``cluster.enable_offload``), and the rule
that every gather of the actor's tensors runs with the actor on its device."""

from __future__ import annotations

from typing import Any


class DeviceTurns:
    """Hands the devices the actor and rollout groups share to one of them, the other waiting in host memory.

    ``enabled``: ``cluster.enable_offload`` with actor and rollout collocated; otherwise nothing moves. Until the
    first hand-over both models are on the device (as built).
    """

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
        """Call an actor method that gathers (or loads) its adapters or optimizer state, the actor on its device.

        Gathers happen on the device the process group was set up for: NCCL has no host-memory path, so an actor
        offloaded for the rollout (an eval right before a save) first gets the device back, the rollout leaving it
        first: one model at a time on the device, one backend per group (a device-mapped ``cpu:gloo,cuda:nccl``
        group would gather from host memory, over a second and slower transport). The next rollout takes the
        device again. (The worker brings itself back too, :meth:`ActorWorker.on_device`, but next to the rollout.)
        """
        if self.holder == "rollout":
            self.hand_to("actor")
        return self.groups["actor"].call(method, *args)

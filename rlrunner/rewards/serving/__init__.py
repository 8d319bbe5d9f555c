"""Rewards over HTTP. The client side: ``client.py`` (``ServiceReward``, the base of every reward that asks a server:
retries, timeouts, counted failures, secrets), ``remote.py`` (``remote``: a reward server's score). The server
side: ``server.py`` (the aiohttp app of ``bin/rlrunner serve_reward``), ``transport.py`` (its connections, held to
``limits.py``: the deadline, slots and connection cap, which the GenEval detector server follows too). ``wire.py``
holds the message formats both sides share (images as base64, score replies, chat replies). A reward that calls a
new kind of server subclasses ``ServiceReward``."""

from . import remote  # noqa: F401  (registers itself)
from .client import ServiceError, ServiceReward
from .remote import RemoteReward

__all__ = ["RemoteReward", "ServiceError", "ServiceReward"]

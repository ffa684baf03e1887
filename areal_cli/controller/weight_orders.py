"""The order to load new weights (``UpdateWeights`` on the control channel), from the trainer's
``WeightsReady`` until every rollout worker has joined that version's broadcast.

The order goes out once every worker said hello. A PUB message sent before a new subscriber's
subscription reached the socket is lost (ZeroMQ's slow joiner), and the trainer would wait in its
broadcast for that worker until the collective times out; so the order is repeated, every
``UPDATE_REPEAT_S``, while a worker has neither loaded nor begun to receive the version (its
heartbeat says which). A worker ignores an order for the version it has.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from areal_cli.controller.peers import Peers
from areal_cli.transport.messages import UpdateWeights

UPDATE_REPEAT_S = 2.0
"""Seconds after a weight-update order before it is repeated to a worker that has neither loaded
the weights nor begun to receive them (its heartbeat, every launcher.heartbeat_s, says which)."""


@dataclass
class WeightOrders:
    pending: int | None = None
    """The version the trainer announced, not ordered yet."""
    sent: int | None = None
    """The last version ordered, until every worker has it."""
    sent_at: float = 0.0
    repeats: dict[int, int] = field(default_factory=dict)
    """version → orders repeated (a lost first order)."""

    def send(self, control, peers: Peers, workers: int, log) -> None:
        """Order the pending version once all ``workers`` are up; repeat the last order where it
        was lost."""
        if self.pending is not None and len(peers.rollouts_up) == workers:
            # only once every worker said hello; its subscription may still be on the way, so the
            # order is repeated until every worker has joined the broadcast (``_repeat``)
            control.send(UpdateWeights(self.pending))
            self.sent, self.sent_at = self.pending, time.monotonic()
            self.pending = None
        self._repeat(control, peers, log)

    def _repeat(self, control, peers: Peers, log) -> None:
        v = self.sent
        if v is None or time.monotonic() - self.sent_at < UPDATE_REPEAT_S:
            return
        missing = peers.not_joined(v)
        if not missing:
            self.sent = None
            return
        if not self.repeats.get(v):
            log.info("weights of version %d: no word from %s yet; ordering the update again "
                     "every %gs until each has joined", v, ", ".join(missing), UPDATE_REPEAT_S)
        self.repeats[v] = self.repeats.get(v, 0) + 1
        control.send(UpdateWeights(v))
        self.sent_at = time.monotonic()

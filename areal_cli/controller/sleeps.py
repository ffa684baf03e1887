"""cluster.share=alternate: before each batch goes to the trainer, every rollout worker stops and
its engine sleeps (``Sleep`` on the control channel, ``Asleep`` back on the status channel), so
that the trainer has the device to itself; the workers wake at the weight update that follows the
step. The order is repeated every ``SLEEP_REPEAT_S`` until each worker has answered (a PUB message
can be lost to a subscriber that joined late)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from areal_cli.transport.messages import Asleep, Sleep

SLEEP_REPEAT_S = 2.0


@dataclass
class SleepOrders:
    step: int = -1
    """The batch the workers were last asked to sleep for."""
    asleep: set = field(default_factory=set)
    """The workers that said they sleep for ``step``."""
    sent_at: float = 0.0
    timings: dict = field(default_factory=dict)
    """worker → its engine's sleep timings for ``step``."""

    def ready(self, step: int, control, workers: int) -> bool:
        """Whether all ``workers`` sleep for batch ``step``; orders (and repeats) it until they
        do."""
        now = time.monotonic()
        if step != self.step:
            self.step, self.asleep, self.timings = step, set(), {}
        elif len(self.asleep) >= workers or now - self.sent_at < SLEEP_REPEAT_S:
            return len(self.asleep) >= workers
        control.send(Sleep(step))
        self.sent_at = now
        return False

    def on_asleep(self, msg: Asleep) -> None:
        if msg.step == self.step:
            self.asleep.add(msg.sender)
            self.timings[msg.sender] = dict(msg.timings)

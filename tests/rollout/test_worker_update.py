"""The rollout worker's side of a weight update received behind generation: begun on the order, applied
when the engine says the wire is done, the loop free meanwhile; a newer order waits for the update on its
way; a stop takes in the update on its way first, for a bounded time."""

from __future__ import annotations

import logging
import types

from areal_cli.rollout.main import Worker
from areal_cli.transport.messages import Phase, WeightsLoaded


class WireEngine:
    """The engine's update protocol with a wire that takes ``checks`` calls of ``update_ready``."""

    def __init__(self, checks: int):
        self.version, self.checks, self.begun = 0, checks, []

    def begin_update(self, version: int) -> None:
        self.begun.append(version)
        self.left = self.checks

    def update_ready(self) -> bool:
        self.left -= 1
        return self.left <= 0

    def finish_update(self) -> dict:
        self.version = self.begun[-1]
        return {"pause_s": 0.01, "pause_total_s": 0.01}


def worker(engine) -> tuple[Worker, list]:
    w = Worker.__new__(Worker)
    sent: list = []
    w.engine, w.name, w.run_dir = engine, "rollout-0", "/nonexistent"
    w.log = logging.getLogger("test-worker")
    w.cfg = types.SimpleNamespace(weights=types.SimpleNamespace(verify=False))
    w.hb = types.SimpleNamespace(send=sent.append, set_doing=lambda what, phase, version: setattr(
        w.hb, "now", (what, phase, version)))
    w.updating, w.next_update, w.update_t0 = None, None, 0.0
    return w, sent


def test_an_update_is_applied_when_its_wire_is_done_and_the_loop_turns_meanwhile():
    eng = WireEngine(checks=3)
    w, sent = worker(eng)
    w._order(1)
    assert eng.begun == [1] and w.updating == 1 and w.hb.now[1:] == (Phase.receiving_weights, 1)
    w._continue_update()
    w._continue_update()
    assert eng.version == 0 and not sent  # the loop went on: nothing applied while the wire is busy
    w._continue_update()
    assert eng.version == 1 and w.updating is None
    assert isinstance(sent[0], WeightsLoaded) and sent[0].version == 1 and sent[0].timings["update_total_s"] >= 0


def test_a_newer_order_waits_for_the_update_on_its_way_and_repeats_are_ignored():
    eng = WireEngine(checks=2)
    w, sent = worker(eng)
    w._order(1)
    w._order(1)  # the controller repeats an order until the worker has joined
    w._order(2)
    assert eng.begun == [1] and w.next_update == 2
    for _ in range(2):
        w._continue_update()
    assert eng.version == 1 and eng.begun == [1, 2] and w.updating == 2
    for _ in range(2):
        w._continue_update()
    assert eng.version == 2 and [m.version for m in sent] == [1, 2]
    w._order(1)  # older than the weights: ignored with a warning
    assert eng.begun == [1, 2]


class DeadWire(WireEngine):
    """A wire whose sender died: never ready."""

    def update_ready(self) -> bool:
        return False

    def poll(self, timeout_s: float) -> list:
        return []


def test_a_stop_takes_in_the_update_on_its_way_and_does_not_wait_for_a_dead_sender():
    eng = WireEngine(checks=3)
    eng.poll = lambda timeout_s: []
    w, sent = worker(eng)
    w._order(1)
    w._finish_update_before_stop()
    assert eng.version == 1 and [m.version for m in sent] == [1]
    dead = DeadWire(checks=1)
    w, sent = worker(dead)
    w._order(1)
    w._finish_update_before_stop(limit_s=0.2)  # returns: the stop is not held by a trainer gone mid-broadcast
    assert dead.version == 0 and not sent and w.updating == 1

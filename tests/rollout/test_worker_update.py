"""The rollout worker's side of a weight update received behind generation, over a real staged
intake (``StagedUpdate`` joined to a ``WeightSender`` on gloo; vLLM's engine loop itself is the fake
core of
``test_vllm_engine``, vLLM not running on the CPU): begun on the order, applied when the wire is
done, the loop free meanwhile; a newer order waits for the update on its way; a stop takes in the
update on its way first, for a bounded time."""

from __future__ import annotations

import logging
import threading
import time
import types

import torch

from areal_cli.rollout.main import Worker
from areal_cli.transport.messages import Phase, WeightsLoaded
from tests.engines.test_vllm_engine import LocalIntake, fake_engine
from tests.engines.test_vllm_inplace import _ends


def staged_worker():
    """(worker, messages it sent, trainer model, sender, intake): the worker's loop state around a
    fake vLLM core whose weights arrive through the real staged intake."""
    trainer, tx, live, rx = _ends(staged=True)
    eng = fake_engine()
    eng.receiver = LocalIntake(rx)
    w = Worker.__new__(Worker)
    sent: list = []
    w.engine, w.name, w.run_dir = eng, "rollout-0", "/nonexistent"
    w.log = logging.getLogger("test-worker")
    w.cfg = types.SimpleNamespace(weights=types.SimpleNamespace(verify=False),
                                  rollout=types.SimpleNamespace(max_staleness=4))
    w.hb = types.SimpleNamespace(send=sent.append, set_doing=lambda what, phase, version: setattr(
        w.hb, "now", (what, phase, version)))
    w.updating, w.next_update, w.update_t0 = None, None, 0.0
    w.asleep_s = None  # cluster.share=alternate: no sleep ended by these updates
    # no groups to judge after an update (Workflow.drop_stale: test_stale_stop)
    w.flow = types.SimpleNamespace()
    return w, sent, trainer, tx, rx


def broadcast(trainer, tx) -> threading.Thread:
    """The trainer's next version (its weights doubled), sent from a thread of its own."""
    with torch.no_grad():
        next(trainer.parameters()).mul_(2.0)
    tx.prepare(iter(trainer.named_parameters()))
    sent = threading.Thread(target=tx.broadcast)
    sent.start()
    return sent


def turn_until(w, done, limit_s: float = 30.0) -> None:
    """Turns of the worker's loop (its update part) until ``done()``."""
    deadline = time.monotonic() + limit_s
    while not done() and time.monotonic() < deadline:
        w.engine.poll(0.001)
        w._continue_update()
    assert done()


def test_an_update_is_applied_when_its_wire_is_done_and_the_loop_turns_meanwhile():
    w, sent, trainer, tx, rx = staged_worker()
    w._order(1)
    assert w.updating == 1 and w.hb.now[1:] == (Phase.receiving_weights, 1)
    for _ in range(5):  # the trainer has not sent: the loop turns, nothing is applied
        w.engine.poll(0.002)
        w._continue_update()
    assert w.engine.version == 0 and not sent and w.updating == 1
    wire = broadcast(trainer, tx)
    turn_until(w, lambda: w.updating is None)
    wire.join()
    assert w.engine.version == 1 and isinstance(sent[0], WeightsLoaded) and sent[0].version == 1
    assert sent[0].timings["weights_changed"] == 1 and sent[0].timings["update_total_s"] > 0
    rx.close()


def test_a_newer_order_waits_for_the_update_on_its_way_and_repeats_and_older_orders_are_ignored():
    w, sent, trainer, tx, rx = staged_worker()
    w._order(1)
    w._order(1)  # the controller repeats an order until the worker has joined
    w._order(2)
    assert w.updating == 1 and w.next_update == 2
    wire = broadcast(trainer, tx)
    turn_until(w, lambda: w.engine.version == 1)
    wire.join()
    assert w.updating == 2 and w.next_update is None  # begun as soon as 1 was in
    wire = broadcast(trainer, tx)
    turn_until(w, lambda: w.updating is None)
    wire.join()
    assert w.engine.version == 2 and [m.version for m in sent] == [1, 2]
    w._order(1)  # older than the weights: ignored with a warning
    assert w.updating is None
    rx.close()


def test_a_stop_takes_in_the_update_on_its_way_and_does_not_wait_for_a_dead_sender():
    w, sent, trainer, tx, rx = staged_worker()
    w._order(1)
    wire = broadcast(trainer, tx)
    w._finish_update_before_stop()
    wire.join()
    assert w.engine.version == 1 and [m.version for m in sent] == [1]
    w._order(2)
    t0 = time.monotonic()
    w._finish_update_before_stop(limit_s=0.3)  # the trainer never sends: the stop is not held
    assert time.monotonic() - t0 < 5 and w.engine.version == 1 and w.updating == 2
    broadcast(trainer, tx).join()  # let the receiving thread end before the intake closes
    rx.close()

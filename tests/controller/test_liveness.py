"""Progress deadlines: a busy peer whose counter stands still is stalled, heartbeat or not."""

from __future__ import annotations

import numpy as np

from areal_cli.controller.liveness import ProgressWatch, culprits
from areal_cli.controller.records import zero_nonfinite_rewards
from areal_cli.transport.messages import GroupResult, Phase, Sample


def test_a_busy_peer_without_progress_is_stalled_after_the_deadline():
    w = ProgressWatch(deadline_s=10)
    w.update("rollout-0", 0.0, progress=5, busy=True)
    # heartbeats keep coming, the counter does not move
    w.update("rollout-0", 9.0, progress=5, busy=True)
    assert w.stalled(9.5) == []
    w.update("rollout-0", 10.5, progress=5, busy=True)
    assert w.stalled(10.5) == [("rollout-0", 10.5)]
    w.update("rollout-0", 11.0, progress=6, busy=True)
    assert w.stalled(20.0) == []


def test_idle_time_is_not_counted_and_the_clock_starts_with_the_work():
    w = ProgressWatch(deadline_s=10)
    w.update("trainer-0", 0.0, progress=3)  # waiting for a batch: not busy
    assert w.stalled(100.0) == []
    w.update("trainer-0", 100.0, busy=True)  # a batch was sent
    assert w.stalled(105.0) == []
    assert [p for p, _ in w.stalled(111.0)] == ["trainer-0"]
    w.touch("trainer-0", 111.0)  # step done
    w.update("trainer-0", 111.0, busy=False)
    assert w.stalled(500.0) == []


def test_deadline_zero_is_off():
    w = ProgressWatch(deadline_s=0)
    w.update("rollout-0", 0.0, progress=1, busy=True)
    assert w.stalled(1e9) == []


def _sample(reward):
    z = np.zeros(2, np.int32)
    return Sample(0, z, z, np.zeros(2, np.float32), z, np.ones(2, np.uint8), reward, "ok", "stop",
                  1, "")


def test_non_finite_rewards_are_scored_zero_and_marked():
    g = GroupResult(0, "p", 0, [_sample(float("nan")), _sample(1.0), _sample(float("-inf"))], 0.1,
                    4)
    assert zero_nonfinite_rewards(g) == 2
    assert [(s.reward, s.reward_status) for s in g.samples] == [(0.0, "nonfinite"), (1.0, "ok"),
                                                                (0.0, "nonfinite")]


def test_a_trainer_stuck_sending_weights_names_the_worker_that_never_joined():
    """The trainer waits in the broadcast for a worker whose main loop is frozen: the worker is the
    culprit. A worker already receiving is in the collective too, so then the trainer stays
    named."""
    watch = ProgressWatch(8)
    watch.update("rollout-0", 0.0, progress=5, busy=True)
    watch.update("rollout-1", 0.0, progress=9, busy=True)
    watch.update("trainer-0", 1.0, busy=True)
    peers = {"trainer-0", "rollout-0", "rollout-1"}
    stalled = watch.stalled(10.0)
    assert [p for p, _ in stalled] == ["rollout-0", "rollout-1", "trainer-0"]
    phase = {"trainer-0": (Phase.sending_weights, 2), "rollout-0": (Phase.other, -1),
             "rollout-1": (Phase.other, -1)}
    named = culprits([("trainer-0", 9.0)], watch, phase, {"rollout-1": 2}, peers, 2, 10.0)
    assert [(p, why) for p, _, why in named] == [
        ("rollout-0", "; trainer-0 waits for it to join the weight update of version 2")]
    assert named[0][1] == 10.0
    phase["rollout-0"] = (Phase.receiving_weights, 2)
    assert [p for p, _, _ in culprits([("trainer-0", 9.0)], watch, phase, {}, peers, 2, 10.0)] == [
        "rollout-1"]
    assert [p for p, _,
            _ in culprits([("trainer-0", 9.0)], watch, phase, {"rollout-1": 2}, peers, 2,
                                      10.0)] == ["trainer-0"]
    # A worker that froze right after loading version 1 still says it was receiving version 1: it
    # has not joined version 2's update, so it is the one named.
    phase["rollout-0"] = (Phase.receiving_weights, 1)
    assert [p for p, _,
            _ in culprits([("trainer-0", 9.0)], watch, phase, {"rollout-0": 1, "rollout-1": 2},
                                      peers, 2, 10.0)] == ["rollout-0"]
    # A worker that has sent no heartbeat yet (or an older one without a phase) has not joined
    # either.
    assert [p for p, _,
            _ in culprits([("trainer-0", 9.0)], watch, {"trainer-0": (Phase.sending_weights, 2)},
                                      {"rollout-1": 2}, peers, 2, 10.0)] == ["rollout-0"]
    phase["trainer-0"] = (Phase.other, -1)  # training step 3: the trainer itself is stuck
    assert [p for p, _,
            _ in culprits([("trainer-0", 9.0)], watch, phase, {}, peers, 2, 10.0)] == ["trainer-0"]
    del phase["trainer-0"]  # nothing heard from the trainer's phase: the same
    assert [p for p, _,
            _ in culprits([("trainer-0", 9.0)], watch, phase, {}, peers, 2, 10.0)] == ["trainer-0"]

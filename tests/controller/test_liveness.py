"""Progress deadlines: a busy peer whose counter stands still is stalled, heartbeat or not."""

from __future__ import annotations

import numpy as np

from areal_cli.controller.liveness import ProgressWatch
from areal_cli.controller.records import zero_nonfinite_rewards
from areal_cli.transport.messages import GroupResult, Sample


def test_a_busy_peer_without_progress_is_stalled_after_the_deadline():
    w = ProgressWatch(deadline_s=10)
    w.update("rollout-0", 0.0, progress=5, busy=True)
    w.update("rollout-0", 9.0, progress=5, busy=True)  # heartbeats keep coming, the counter does not move
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
    return Sample(0, z, z, np.zeros(2, np.float32), z, np.ones(2, np.uint8), reward, "ok", "stop", 1, "")


def test_non_finite_rewards_are_scored_zero_and_marked():
    g = GroupResult(0, "p", 0, [_sample(float("nan")), _sample(1.0), _sample(float("-inf"))], 0.1, 4)
    assert zero_nonfinite_rewards(g) == 2
    assert [(s.reward, s.reward_status) for s in g.samples] == [(0.0, "nonfinite"), (1.0, "ok"), (0.0, "nonfinite")]

"""workflow.agent_timeout_s measures the agent's own time: a call held in a busy worker (queued,
never submitted while the worker's loop is elsewhere) does not count, the agent's own sleep does;
agent_wall_timeout_s counts both. And workflow.agent_failed_episode: a group with a failed episode
is dropped, or trained with the failed episode at reward 0. Timings keep margins of seconds, for a
slow, loaded machine."""

from __future__ import annotations

import logging
import time

import pytest
from agent_harness import agent_setup, drive, item


@pytest.fixture
def setup(tiny_model):
    yield from agent_setup(tiny_model)


def _hold(flow, calls: int, hold_s: float) -> None:
    """Keep the worker's loop away (no call submitted to the engine) for ``hold_s`` seconds once
    ``calls`` calls wait in it: the engine as busy as it gets."""
    deadline = time.monotonic() + 60
    while (arrived := flow.bridge.pending.qsize()) < calls:
        assert time.monotonic() < deadline, f"{arrived} of {calls} agent calls arrived in 60 s"
        time.sleep(0.01)
    time.sleep(hold_s)


def test_time_in_the_engine_is_not_the_agents_and_its_own_time_is(setup, caplog):
    """agent_timeout_s=4: a call held 8 s in the worker passes; 8 s of the agent's own sleep after
    it does not. (The agent's own time before its call, the client's code and the HTTP request,
    counts too: on a loaded 2-core machine a 2 s budget was spent on it before the call arrived.)"""
    eng, make = setup
    flow = make("held_then_sleeps", agent_timeout_s=4.0)
    with caplog.at_level(logging.ERROR):
        flow.start(item(0, size=1))
        flow.start(item(1, size=1, sleep=8.0))
        _hold(flow, 2, 8.0)
        results, _ = drive(flow, eng, 2, timeout_s=60)
    failed = {r.group_id: r.failed for r in results}
    assert failed == {0: 0, 1: 1}
    patient = next(r for r in results if r.group_id == 0)
    assert patient.gen_time_s > 8.0 and patient.samples[0].reward == 1.0
    [why] = [r.getMessage() for r in caplog.records if "(episode 0 of group 1)" in r.getMessage()]
    assert "ran past workflow.agent_timeout_s=4s of its own time" in why
    waited = float(why.split("of its own time (")[1].split("s waiting")[0])
    assert waited >= 8.0  # the held call's time, measured and left out


def test_the_wall_limit_counts_the_engine_too(setup, caplog):
    eng, make = setup
    flow = make("held_then_sleeps", agent_timeout_s=600.0, agent_wall_timeout_s=4.0)
    with caplog.at_level(logging.ERROR):
        flow.start(item(0, size=1))
        _hold(flow, 1, 7.0)
        [g], _ = drive(flow, eng, 1, timeout_s=60)
    assert g.failed == 1 and g.samples == []
    assert "ran past workflow.agent_wall_timeout_s=4s of wall time" in caplog.text
    assert flow.bridge.aborted == 1 and not flow.bridge.waiting  # its call never reached the engine


@pytest.mark.parametrize("policy, meta, trained", [
    ("drop_group", {}, False), ("reward_zero", {}, True),
    ("reward_zero", {"no_call": True}, False)])
def test_a_failed_episodes_group_is_dropped_or_trained_at_reward_0(setup, policy, meta, trained):
    eng, make = setup
    flow = make("first_of_each_pair_fails", agent_failed_episode=policy)
    flow.start(item(0, size=2, **meta))
    [g], _ = drive(flow, eng, 1)
    assert g.failed == 1 and g.counters["agent_failed"] == 1
    if not trained:
        assert g.samples == []
        return
    rewards = sorted((s.reward, s.reward_status) for s in g.samples)
    assert rewards == [(0.0, "agent_failed"), (1.0, "ok")] and g.episodes() == 2

"""Agents that call through a client they were not handed — the openai module's own, one built from
the environment, a process-wide default each episode sets — against the real endpoint and tiny
engine: with 8 episodes at once, every call is recorded into the episode whose code made it,
whatever episode (or none) its URL names; a synchronous client called from the endpoint's own loop
is refused at once, naming the fix."""

from __future__ import annotations

import logging
import os
import time

import pytest
from agent_harness import agent_setup, drive, holds, item

from areal_cli.workflows.agent.context import SYNC_IN_LOOP


@pytest.fixture
def setup(tiny_model):
    yield from agent_setup(tiny_model)


# agent, and how many of each episode's 2 calls name another episode (or none) in their URL:
# "some" where it depends on which episode set the shared client last
SHARED_CLIENTS = {"module_client_sync": "some", "environment_client": 2,
                  "default_set_by_each": "some"}


@pytest.mark.parametrize("agent, processes", [(a, 0) for a in SHARED_CLIENTS] + [
    ("environment_client", 2), ("default_set_by_each", 2)])
def test_calls_through_a_process_wide_client_are_recorded_into_the_episode_making_them(
        setup, agent, processes):
    """In the worker's own loop, and in agent processes (each its own process-wide clients)."""
    eng, make = setup
    flow = make(agent, agent_processes=processes)
    for g in range(4):  # 8 episodes at once
        flow.start(item(g))
    results, seen = drive(flow, eng, 4)
    rerouted = 0
    for r in results:
        assert not r.failed, r
        # each episode: its 2 calls, the second extending the first, in one trajectory
        assert r.counters["agent_calls"] == 4 and r.counters["agent_splits"] == 0
        assert sorted(s.episode for s in r.samples) == [0, 1]
        assert all(s.num_turns == 2 for s in r.samples)
        assert r.counters.get("agent_unattributed_calls", 0) == 0
        rerouted += r.counters.get("agent_rerouted_calls", 0)
    expected = SHARED_CLIENTS[agent]
    assert rerouted == 8 * expected if expected != "some" else 0 < rerouted <= 16
    samples = [s for r in results for s in r.samples]
    assert len(seen) == 16 and all(any(holds(s, seq) for s in samples) for seq in seen)


def test_a_client_built_from_the_environment_reaches_the_next_endpoint_of_its_process(setup):
    """areal eval runs one endpoint after another in a process (a model, a task): the next one is
    served at the same URL with the same key, so a client built from the environment for the first
    reaches it."""
    eng, make = setup
    first = make("environment_client")
    first.start(item(0))
    assert not drive(first, eng, 1)[0][0].failed
    env = {k: os.environ[k] for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    first.close()
    second = make("environment_client")
    assert {k: os.environ[k] for k in env} == env
    second.start(item(1))
    [r], _ = drive(second, eng, 1)
    assert not r.failed and r.counters["agent_calls"] == 4 and r.counters["agent_splits"] == 0


def test_a_synchronous_agent_on_a_process_wide_anthropic_client_records_its_episodes(setup):
    """examples/agents/anthropic_sync.py: one anthropic.Anthropic from the environment (the worker's
    plain URL) for every thread: each episode's two Messages calls are its own (a split: the second
    starts afresh)."""
    eng, make = setup
    flow = make("anthropic_sync")
    for g in range(4):
        flow.start(item(g))
    results, _ = drive(flow, eng, 4)
    for r in results:
        assert not r.failed and r.counters["agent_calls"] == 4 and r.counters["agent_splits"] == 2
        assert sorted(s.episode for s in r.samples) == [0, 0, 1, 1]
    # endpoint-wide counts, reported with whichever group finished next
    assert sum(r.counters.get("agent_rerouted_calls", 0) for r in results) == 16


def test_a_synchronous_client_in_an_async_agent_fails_its_episode_at_once_naming_the_fix(setup,
                                                                                          caplog):
    eng, make = setup
    flow = make("sync_client_in_the_loop", agent_timeout_s=60)
    t0 = time.monotonic()
    with caplog.at_level(logging.ERROR):
        flow.start(item(0))
        [r], _ = drive(flow, eng, 1, timeout_s=30)
    assert r.failed == 2 and time.monotonic() - t0 < 10
    assert SYNC_IN_LOOP in caplog.text and "run.blocking = True" in SYNC_IN_LOOP

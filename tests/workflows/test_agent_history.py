"""Agents that rewrite their history — one that summarises its work and answers in a fresh context,
one that runs a subagent in a context of its own — against the real endpoint and tiny engine: each
episode is several trajectories, and workflow.agent_credit decides which are sent to train: all of
them with the episode's reward (shared), or the one of its last call alone (last)."""

from __future__ import annotations

import pytest
from agent_harness import agent_setup, drive, item


@pytest.fixture
def setup(tiny_model):
    yield from agent_setup(tiny_model)


def _run(make, eng, agent: str, credit: str):
    flow = make(agent, agent_credit=credit)
    flow.start(item(0, size=2))
    [g], _ = drive(flow, eng, 1)
    assert not g.failed
    return g, flow.tok


@pytest.mark.parametrize("credit", ["shared", "last"])
def test_an_agent_that_summarises_and_starts_afresh_makes_two_trajectories(setup, credit):
    """Work + its summary (one trajectory: the summary extends the work), then the answer in a
    fresh context: a split; with last, only the answer's trajectory is sent."""
    eng, make = setup
    g, tok = _run(make, eng, "summarise_then_answer", credit)
    assert g.counters["agent_calls"] == 6 and g.counters["agent_splits"] == 2
    assert g.counters["agent_trajectories"] == 4  # recorded, whichever are sent
    per_episode = {e: [s for s in g.samples if s.episode == e] for e in (0, 1)}
    for samples in per_episode.values():
        turns = [s.num_turns for s in samples]
        assert turns == ([2, 1] if credit == "shared" else [1])
        answer = samples[-1]
        assert "Earlier work:" in tok.decode(answer.prompt_ids)
        assert len({s.reward for s in samples}) == 1


def test_credit_last_sends_the_trajectory_of_the_last_call_not_the_last_begun(setup):
    """A subagent's fresh context begins a trajectory after the parent's, but the parent makes the
    episode's last call: its trajectory is the one sent."""
    eng, make = setup
    g, tok = _run(make, eng, "with_a_subagent", "last")
    assert g.counters["agent_splits"] == 2 and g.counters["agent_trajectories"] == 4
    assert sorted(s.episode for s in g.samples) == [0, 1]
    for s in g.samples:
        assert s.num_turns == 2 and "A helper says:" in tok.decode(s.output_ids)

"""workflow=agent end to end: `areal train` with an example agent (plain OpenAI-client code) on the
tiny model, two trainer ranks; its calls become trajectories the trainer trains on, and the agent's
counts reach metrics.jsonl."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_RUN, read_jsonl, run_train

from areal_cli.tasks import load_tokenizer


@pytest.mark.slow  # a whole run (~25 s on 2 cores): `make test-slow`, which CI runs too
def test_an_agent_of_two_calls_trains_and_its_counts_are_in_the_metrics(tiny_model, tmp_path):
    """With logging.trajectory_tokens, trajectories.jsonl holds what was trained: the answer's ids
    decode to exactly the text the agent was answered, and the plan it was answered is in the
    answer's prompt."""
    run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, "trainer.steps=2", "trainer.ranks=2",
              "rollout.group_size=3", "workflow=agent",
              "workflow.agent=examples.agents.plan_then_answer:run",
              "logging.trajectory_tokens=true", timeout=300)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert sum(r["agent_episodes"] for r in rows) >= 12 and all(r.get("agent_failed", 0) == 0
                                                                for r in rows)
    assert sum(r["agent_calls"] for r in rows) == 2 * sum(r["agent_episodes"] for r in rows)
    assert sum(r["agent_splits"] for r in rows) == sum(r["agent_episodes"] for r in rows)
    # where the episodes' time went: every call was in the engine a while, and the agent's own
    # time (its code, the HTTP round trips) is a part of the wall time, not negative
    for r in rows:
        assert (r["agent_engine_s"] > 0) == (r["agent_episodes"] > 0)
        assert r["agent_own_s"] >= 0 and r["agent_wait_s"] >= 0
    trained = read_jsonl(tmp_path / "trajectories.jsonl")
    per_episode = {}
    for t in trained:
        per_episode.setdefault((t["group_id"], t["episode"]), []).append(t)
    assert len(trained) == 2 * 2 * 3 * 2 and all(len(v) == 2 for v in per_episode.values())
    tok = load_tokenizer(tiny_model)

    def sampled(t) -> str:
        return tok.decode([i for i, m in zip(t["output_ids"], t["loss_mask"], strict=True) if m],
                          skip_special_tokens=True)

    for plan, answer in (sorted(v, key=lambda t: t["sample_index"]) for v in per_episode.values()):
        assert sampled(answer) == answer["completion"]  # the text the agent was answered
        assert f"Your plan: {sampled(plan)}" in tok.decode(answer["prompt_ids"])
        assert len(answer["logprobs"]) == len(answer["versions"]) == len(answer["output_ids"])
    key = json.loads((tmp_path / "agent-0.json").read_text())
    assert key["base_url"].startswith("http://127.0.0.1:")
    assert (tmp_path / "agent-0.json").stat().st_mode & 0o077 == 0


@pytest.mark.slow
def test_an_agent_that_always_fails_stops_the_run_naming_it(tiny_model, tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1] / "workflows"))
    proc = run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, "trainer.steps=2",
                     "workflow=agent",
                     "workflow.agent=agent_cases:raises", check=False, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr + (tmp_path / "logs" / "controller.log").read_text()
    assert "workflow.agent=agent_cases:raises" in out and "max_failed_fraction" in out
    assert "the agent's own bug" in (tmp_path / "logs" / "rollout-0.log").read_text()


@pytest.mark.slow  # two steps of the default model on the CPU (~4 min on 2 shared cores)
def test_an_agent_on_the_anthropic_client_trains_the_default_model(tmp_path):
    """examples/agents/anthropic_tool.py: the official anthropic client against the endpoint's
    /v1/messages; a tool_use answered with a tool_result extends its episode's first call."""
    run_train(tmp_path, "trainer.steps=2", "trainer.batch_size=2", "rollout.group_size=2",
              "reward.workers=1", "workflow=agent", "workflow.max_turns=3",
              "workflow.agent=examples.agents.anthropic_tool:run", timeout=900)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r.get("agent_failed", 0) == 0 and r["agent_bad_requests"] == 0 for r in rows)
    episodes = sum(r["agent_episodes"] for r in rows)
    # every episode whose first call came back as a tool_use made a second call, extending it
    assert sum(r["agent_calls"] for r in rows) > episodes and sum(r["agent_tool_calls"]
                                                                  for r in rows) > 0
    assert sum(r["agent_splits"] for r in rows) == 0
    assert sum(r["agent_trajectories"] for r in rows) == episodes

@pytest.mark.slow
@pytest.mark.parametrize("script", ["curl_agent.sh", "curl_anthropic.sh"])
def test_a_program_agent_calling_the_endpoint_with_curl_trains_the_default_model(tmp_path, script):
    """workflow.agent_cmd: a shell script, one process per episode, calling the episode's endpoint
    with curl, in OpenAI's dialect (OPENAI_BASE_URL / OPENAI_API_KEY, /v1/chat/completions) or
    Anthropic's (ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY, /v1/messages); two CPU steps of the default
    model."""
    run_train(tmp_path, "trainer.steps=2", "trainer.batch_size=2", "rollout.group_size=2",
              "rollout.max_new_tokens=16", "task.size=64", "reward.workers=1", "workflow=agent",
              f"workflow.agent_cmd=sh examples/agents/{script}", timeout=900)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r.get("agent_failed", 0) == 0 and r["agent_bad_requests"] == 0 for r in rows)
    assert sum(r["agent_calls"] for r in rows) == sum(r["agent_episodes"] for r in rows) >= 8
    trained = read_jsonl(tmp_path / "trajectories.jsonl")
    assert len(trained) == 2 * 2 * 2 and all(t["num_turns"] == 1 for t in trained)


@pytest.mark.slow  # 50-75 s on 2 shared cores
def test_an_agent_on_a_process_wide_client_trains_with_every_call_in_its_own_episode(tiny_model,
                                                                                      tmp_path):
    """examples/agents/default_client.py ignores the client it is handed: one module-level
    AsyncOpenAI built from OPENAI_BASE_URL (the worker's plain /v1) serves 8 episodes at once
    (2 groups of 4 admitted at a time), and each call is recorded into the episode making it: two
    calls an episode, the second extending the first, no split, none outside an episode."""
    run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, "trainer.steps=2",
              "rollout.group_size=4", "rollout.max_staleness=0", "workflow=agent",
              "workflow.max_turns=2", "workflow.agent=examples.agents.default_client:run",
              timeout=300)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    episodes = sum(r["agent_episodes"] for r in rows)
    assert episodes >= 16 and all(r.get("agent_failed", 0) == 0 for r in rows)
    assert sum(r["agent_calls"] for r in rows) == 2 * episodes
    assert sum(r["agent_rerouted_calls"] for r in rows) == 2 * episodes
    assert sum(r["agent_splits"] + r["agent_unattributed_calls"] for r in rows) == 0
    trained = read_jsonl(tmp_path / "trajectories.jsonl")
    assert len(trained) == 2 * 2 * 4 and all(t["num_turns"] == 2 for t in trained)


@pytest.mark.slow  # 45-70 s on 2 shared cores
def test_an_agent_that_summarises_its_history_trains_only_its_answer_with_credit_last(tiny_model,
                                                                                       tmp_path):
    """examples/agents/summarise_then_answer.py: two trajectories an episode (work + summary, then
    the answer in a fresh context); with workflow.agent_credit=last the answer's alone trains."""
    run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, "trainer.steps=2", "workflow=agent",
              "workflow.max_turns=3", "workflow.agent=examples.agents.summarise_then_answer:run",
              "workflow.agent_credit=last", timeout=300)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    episodes = sum(r["agent_episodes"] for r in rows)
    assert all(r.get("agent_failed", 0) == 0 for r in rows)
    assert sum(r["agent_trajectories"] for r in rows) == 2 * episodes
    assert sum(r["agent_splits"] for r in rows) == episodes
    trained = read_jsonl(tmp_path / "trajectories.jsonl")
    assert len(trained) == 2 * 2 * 2 and all(t["num_turns"] == 1 for t in trained)

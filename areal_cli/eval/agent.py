"""`areal eval workflow=agent`: the agent run once per problem, greedily, through the endpoint of an
``AgentWorkflow`` on the evaluator's engine. The task's reward scores the agent's last reply (the
accuracy, comparable with single_turn's); the agent's own reward and its calls are kept per
sample."""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

from areal_cli.rewards.extract import extract_answer
from areal_cli.tasks.base import Problem
from areal_cli.transport.messages import WorkItem
from areal_cli.workflows.agent.workflow import AgentWorkflow


def agent_pass(engine, tok, pool, workflow, problems: list[Problem], max_new_tokens: int,
               context: int,
               timeout_s: float, model: str) -> list[dict]:
    """One sample per problem: {prompt_id, pass, completion, answer, reference, score, ...}."""
    # an episode waits for the engine behind every other one started with it: bounded by the
    # evaluation's own no-progress limit rather than by training's per-episode
    # workflow.agent_timeout_s
    workflow = dataclasses.replace(workflow,
                                   agent_timeout_s=max(workflow.agent_timeout_s, timeout_s or 0))
    flow = AgentWorkflow(workflow, engine, pool, tok, 0, model=model, max_new_tokens=max_new_tokens,
                         context=context)
    try:
        for i, p in enumerate(problems):
            flow.start(WorkItem(i, p.id, np.zeros(0, np.int32), 1, max_new_tokens, p.to_dict(), 0))
        results, last = {}, time.monotonic()
        while len(results) < len(problems):
            for seq in engine.poll(0.05):
                flow.on_generated(seq)
                last = time.monotonic()
            for g in flow.poll():
                results[g.group_id], last = g, time.monotonic()
                if len(results) % 25 == 0 or len(results) == len(problems):
                    say(f"  agent: {len(results)}/{len(problems)} problems done")
            if timeout_s and time.monotonic() - last > timeout_s:
                raise TimeoutError(f"the agent made no progress for {timeout_s:g}s "
                                   f"({len(problems) - len(results)} problems left)")
        texts = {i: (g.samples[-1].completion if g.samples else "") for i, g in results.items()}
        scores = {i: pool.submit(t, problems[i]) for i, t in texts.items()}
        return [_record(problems[i], results[i], texts[i], scores[i].result())
                for i in sorted(results)]
    finally:
        flow.close()


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _record(problem: Problem, g, text: str, scored) -> dict:
    model_tokens = sum(int(s.loss_mask.sum()) for s in g.samples)
    return {"prompt_id": problem.id, "pass": "greedy", "sample": 0, "completion": text,
            "answer": extract_answer(text), "reference": problem.answer,
            "score": float(scored.score) if not g.failed else 0.0,
            "reward_status": scored.status if not g.failed else "error", "length": model_tokens,
            "finish_reason": g.samples[-1].finish_reason if g.samples else "error",
            "agent_reward": float(g.samples[0].reward) if g.samples else None,
            "agent_calls": g.counters.get("agent_calls", 0.0)}

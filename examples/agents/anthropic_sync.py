r"""plan_then_answer as a synchronous agent in Anthropic's dialect: a plain `def`, run in the
rollout worker's agent threads, calling the Messages API through an `anthropic.Anthropic` client
built from the environment (ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY name the worker's endpoint),
one for the process rather than one per episode. Its calls are recorded into the episode whose
thread makes them.

    areal train workflow=agent workflow.agent=examples.agents.anthropic_sync:run \
        workflow.max_turns=2

It returns None: the task's own reward scores the answer (the second call's reply).
"""

from __future__ import annotations

import functools
import os

import anthropic


@functools.cache
def claude(base_url: str) -> anthropic.Anthropic:
    """The process's client for the endpoint the environment names (built at the first call)."""
    return anthropic.Anthropic(base_url=base_url, max_retries=0)


def run(_client, problem):
    client = claude(os.environ["ANTHROPIC_BASE_URL"])
    plan = client.messages.create(model="policy", max_tokens=48, messages=[
        {"role": "user",
         "content": f"In one sentence, how would you solve this? {problem.prompt}"}])
    client.messages.create(model="policy", max_tokens=1024,
                           system=f"Your plan: {plan.content[0].text if plan.content else ''}",
                           messages=[{"role": "user", "content": problem.prompt}])
    return None

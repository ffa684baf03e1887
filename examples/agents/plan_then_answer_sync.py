r"""plan_then_answer as a synchronous agent: a plain `def`, given an `openai.OpenAI` client, run in
the rollout worker's agent threads (workflow.agent_concurrency of them), so its blocking calls (and
any blocking code of its own) never stall the other episodes.

    areal train workflow=agent workflow.agent=examples.agents.plan_then_answer_sync:run \
        workflow.max_turns=2

It returns None: the task's own reward scores the answer (the second call's reply).
"""

from __future__ import annotations


def run(client, problem):
    plan = client.chat.completions.create(model="policy", max_tokens=48, messages=[
        {"role": "user",
         "content": f"In one sentence, how would you solve this? {problem.prompt}"}])
    client.chat.completions.create(model="policy", messages=[
        {"role": "system", "content": f"Your plan: {plan.choices[0].message.content}"},
        {"role": "user", "content": problem.prompt}])
    return None

r"""A two-call agent: it asks the model for a plan, then asks again with the plan in a fresh system
message, so the second call does not extend the first. Each episode becomes two trajectories that
share its reward (workflow.agent_credit=shared, or only the answer trains with last). It imports
only the standard library; the client it is given is an `openai.AsyncOpenAI`.

    areal train workflow=agent workflow.agent=examples.agents.plan_then_answer:run \
        workflow.max_turns=2

It returns None: the task's own reward scores the answer (the second call's reply).
"""

from __future__ import annotations


async def run(client, problem):
    plan = await client.chat.completions.create(model="policy", max_tokens=48, messages=[
        {"role": "user",
         "content": f"In one sentence, how would you solve this? {problem.prompt}"}])
    await client.chat.completions.create(model="policy", messages=[
        {"role": "system", "content": f"Your plan: {plan.choices[0].message.content}"},
        {"role": "user", "content": problem.prompt}])
    return None

r"""An agent that ignores the client it is handed and calls through one process-wide client built
when its module is imported, from OPENAI_BASE_URL and OPENAI_API_KEY, as code written for a
framework's default client does. The rollout worker points those variables at its endpoint, and
each call is recorded into the episode whose code makes it, however many episodes share the
client.

    areal train workflow=agent workflow.agent=examples.agents.default_client:run \
        workflow.max_turns=2

Two calls: an answer, then a check of it that extends the first (one trajectory per episode). It
returns None: the task's own reward scores the last reply.
"""

from __future__ import annotations

import openai

CLIENT = openai.AsyncOpenAI(max_retries=0)  # the process's one client


async def run(_client, problem):
    messages = [{"role": "user", "content": problem.prompt}]
    reply = await CLIENT.chat.completions.create(model="policy", max_tokens=64, messages=messages)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                 {"role": "user", "content": "Check your answer and end with 'Answer: <number>'."}]
    await CLIENT.chat.completions.create(model="policy", messages=messages)
    return None

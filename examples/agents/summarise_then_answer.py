r"""An agent that rewrites its history: it works on the problem, asks the model to summarise that
work (a call extending the first), then drops the conversation and answers in a fresh context that
holds only the summary, as an agent compacting a long history does. The fresh context does not
extend the earlier calls, so each episode is two trajectories (one split): the work and its summary,
then the answer.

    areal train workflow=agent workflow.agent=examples.agents.summarise_then_answer:run \
        workflow.max_turns=3 workflow.agent_credit=last

workflow.agent_credit says which of them train: `shared` (both, with the episode's advantage) or
`last` (the answer's alone). It returns None: the task's own reward scores the answer.
"""

from __future__ import annotations


async def run(client, problem):
    messages = [{"role": "user", "content": problem.prompt}]
    work = await client.chat.completions.create(model="policy", max_tokens=64, messages=messages)
    messages += [{"role": "assistant", "content": work.choices[0].message.content},
                 {"role": "user", "content": "Summarise your work so far in one sentence."}]
    summary = await client.chat.completions.create(model="policy", max_tokens=48,
                                                   messages=messages)
    await client.chat.completions.create(model="policy", messages=[  # the history, compacted
        {"role": "system", "content": f"Earlier work: {summary.choices[0].message.content}"},
        {"role": "user", "content": f"{problem.prompt} End with 'Answer: <number>'."}])
    return None

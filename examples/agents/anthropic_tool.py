r"""The calculator agent (calculator.py) written against Anthropic's Messages API with the official
`anthropic` client: the model must call a `calculate` tool, its tool_use is answered with a
tool_result, and it answers from that.

    areal train workflow=agent workflow.agent=examples.agents.anthropic_tool:run \
        workflow.max_turns=3

`client.anthropic` is an `anthropic.AsyncAnthropic` for this episode (calls to its `/v1/messages`
are recorded like chat calls), sharing the worker's connection pool. An agent that builds its own
gets the same episode with `anthropic.AsyncAnthropic(base_url=str(client.base_url).rstrip("/")
.removesuffix("/v1"), api_key=client.api_key)`, at the cost of its own connections.

Reward: 1 for a correct final answer, 0 otherwise (also when the call ran out of tokens before it
was finished); `called_tool` is logged as `agent_extra_called_tool`.
"""

from __future__ import annotations

from examples.agents.calculator import SYSTEM, calculate, final_number

TOOLS = [{"name": "calculate",
          "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
          "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}},
                           "required": ["expression"]}}]


async def run(client, problem) -> dict:
    """Call 1 must use `calculate` (tool_choice names it: decoded under the call's grammar); call 2
    sends each tool_use's result as a tool_result and gets the answer with the tool still offered
    but not callable (tool_choice none), so it extends call 1 as one trajectory."""
    claude = client.anthropic
    messages = [{"role": "user", "content": problem.prompt}]
    reply = await claude.messages.create(model="policy", system=SYSTEM, messages=messages,
                                         tools=TOOLS, max_tokens=48,
                                         tool_choice={"type": "tool", "name": "calculate"})
    uses = [b for b in reply.content if b.type == "tool_use"]
    if not uses:  # the call ran out of tokens before it was finished: nothing to answer from
        return {"reward": 0.0, "called_tool": 0}
    results = [{"type": "tool_result", "tool_use_id": u.id,
                "content": calculate(str(u.input.get("expression", "")))} for u in uses]
    messages += [{"role": "assistant", "content": reply.content},
                 {"role": "user", "content": results}]
    reply = await claude.messages.create(model="policy", system=SYSTEM, messages=messages,
                                         tools=TOOLS, max_tokens=256, tool_choice={"type": "none"})
    answer = final_number("".join(b.text for b in reply.content if b.type == "text"))
    try:
        correct = answer is not None and float(answer) == float(problem.answer)
    except ValueError:
        correct = False
    return {"reward": 1.0 if correct else 0.0, "called_tool": 1}

"""A calculator agent: the model must call a `calculate` tool for the arithmetic, sees its result
and answers. It imports only `openai` and the standard library, as an agent written for any
OpenAI-compatible server would.

    areal train workflow=agent workflow.agent=examples.agents.calculator:run workflow.max_turns=3

The first call names the tool in `tool_choice`, so the endpoint decodes it under the call's grammar
(the model writes the call, its arguments held to the tool's schema); the second call answers from
the tool's result. Reward: 1 for a correct final answer, 0 otherwise (also when the call ran out of
tokens before it was finished).
`called_tool` is logged as `agent_extra_called_tool` in metrics.jsonl: the share of episodes whose
call parsed.
"""

from __future__ import annotations

import ast
import json
import operator
import re

SYSTEM = ('Use the calculate tool for arithmetic. For example, for "What is 2 + 3?" you write:\n'
          '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>\n'
          'The tool answers 5, and you reply "Answer: 5".')
TOOLS = [{"type": "function", "function": {
    "name": "calculate",
    "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.Div: operator.truediv,
       ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """The tool: arithmetic only (the expression is parsed, never executed)."""
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.operand))
        raise ValueError("not arithmetic")
    try:
        value = ev(ast.parse(expression[:200], mode="eval").body)
    except (ValueError, SyntaxError, ZeroDivisionError, TypeError):
        return "error: give an arithmetic expression such as 3 + 4 * 2"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def final_number(text: str) -> str | None:
    """The number after the last "Answer:", else the last number of the text."""
    text = text.replace(",", "")
    marked = re.findall(r"Answer:\s*(-?\d+(?:\.\d+)?)", text)
    found = marked or re.findall(r"-?\d+(?:\.\d+)?", text)
    return found[-1] if found else None


async def run(client, problem) -> dict:
    """Call 1 must call `calculate` (tool_choice names it: decoded under the call's grammar); call
    2 sees the tool's result and answers with the tools still offered but not callable
    (tool_choice="none"), so it extends call 1 as one trajectory."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem.prompt}]
    reply = await client.chat.completions.create(
        model="policy", messages=messages, tools=TOOLS, max_tokens=48,
        tool_choice={"type": "function", "function": {"name": "calculate"}})
    message = reply.choices[0].message
    # the call ran out of tokens before it was finished: nothing to answer from
    if not message.tool_calls:
        return {"reward": 0.0, "called_tool": 0}
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls:
        try:
            args = json.loads(call.function.arguments)
            result = calculate(str(args.get("expression", "")))
        except (ValueError, AttributeError):
            result = "error: arguments must be a JSON object"
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                 tool_choice="none")
    answer = final_number(reply.choices[0].message.content or "")
    try:
        correct = answer is not None and float(answer) == float(problem.answer)
    except ValueError:
        correct = False
    return {"reward": 1.0 if correct else 0.0, "called_tool": 1}

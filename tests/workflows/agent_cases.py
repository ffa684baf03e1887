"""Agents the endpoint tests run (workflow.agent=agent_cases:<name>); each uses only the client."""

from __future__ import annotations

import asyncio
import time

TOOLS = [{"type": "function",
          "function": {"name": "calculate", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {}}}}]


async def three_calls(client, problem):
    """Chat with tools, then a streamed follow-up, then n=2: each extends the one before."""
    messages = [{"role": "user", "content": problem.prompt}]
    first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                 max_tokens=6)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "Go on."}]
    stream = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6,
                                                  stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Once more."}]
    last = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6,
                                                n=2)
    assert len(last.choices) == 2
    return {"reward": 1.0, "choices": len(last.choices)}


async def plan_then_answer(client, problem):
    """Two calls, the second not extending the first: two trajectories, one split."""
    plan = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": f"Plan: {problem.prompt}"}],
        max_tokens=4)
    await client.chat.completions.create(model="policy", max_tokens=4, messages=[
        {"role": "system", "content": f"Plan: {plan.choices[0].message.content}"},
        {"role": "user", "content": problem.prompt}])
    return 0.5


async def responses_and_completions(client, problem):
    """The Responses API with a function tool, then /v1/completions."""
    r = await client.responses.create(model="policy", input=problem.prompt, max_output_tokens=5,
                                      tools=[{"type": "function", "name": "calculate",
                                              "parameters": {}}])
    assert r.output and r.status == "completed"
    c = await client.completions.create(model="policy", prompt="2 + 2 =", max_tokens=3)
    assert c.choices[0].finish_reason in ("stop", "length")
    return None  # the task's reward scores the last reply


async def raises(client, problem):
    await client.chat.completions.create(model="policy",
                                         messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    raise RuntimeError("the agent's own bug")


async def hangs(client, problem):
    await asyncio.sleep(3600)


async def no_call(client, problem):
    return 1.0


async def bad_return(client, problem):
    await client.chat.completions.create(model="policy",
                                         messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    return "yes"


SMALL = {"type": "object", "required": ["n", "ok"],
         "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                        "ok": {"type": "boolean"}}}


async def forced_call(client, problem):
    """A call that tool_choice forces to `calculate` (it must come back parsed), then one naming a
    tool that is not offered."""
    first = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": problem.prompt}], tools=TOOLS,
        max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "calculate"}})
    if first.choices[0].finish_reason != "tool_calls":
        return 0.0
    try:
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": problem.prompt}], tools=TOOLS,
            max_tokens=6,
            tool_choice={"type": "function", "function": {"name": "search"}})
    except Exception as err:  # noqa: BLE001 — the test reads what the endpoint answered
        refused = getattr(err, "status_code", 0) == 400
        return 1.0 if refused and getattr(err, "param", "") == "tool_choice" else 0.0
    return 0.0


async def writes_into_its_sibling(client, problem):
    """One call of its own, then a call into the episode beside it (the sibling's key guessed from
    its own: group and index known, the secret not): the endpoint must refuse it."""
    import openai

    await client.chat.completions.create(model="policy", max_tokens=3,
                                         messages=[{"role": "user", "content": problem.prompt}])
    base = str(client.base_url)  # .../episodes/<group>-<i>-<secret>/v1/
    key = base.rstrip("/").split("/")[-2]
    group, index, *secret = key.split("-", 2)
    sibling = f"{group}-{1 - int(index)}"
    for guess in (sibling, "-".join([sibling, *secret])):
        other = openai.AsyncOpenAI(base_url=base.replace(key, guess), api_key=client.api_key,
                                   max_retries=0)
        try:
            await other.chat.completions.create(model="policy", max_tokens=3,
                                                messages=[{"role": "user", "content": "x"}])
            return {"reward": 0.0, "wrote_into": guess}
        except openai.NotFoundError:
            pass
        finally:
            await other.close()
    return 1.0


# ---- Anthropic's Messages API, through the anthropic client (client.anthropic) ----

CALCULATE = {"name": "calculate", "description": "Evaluate an arithmetic expression.",
             "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}},
                              "required": ["expression"]}}
SYSTEM = ('Use the calculate tool for arithmetic. For example, for "What is 2 + 3?" you write:\n'
          '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>\n'
          'The tool answers 5, and you reply "Answer: 5".')
STREAMED: list = []  # each call's final message, as the anthropic client's stream parser built it


async def anthropic_tool(client, problem):
    """A call that must use `calculate` (streamed: its tool_use arrives as input_json_delta); its
    tool_use answered with a tool_result in a second call, streamed too (tools offered, not
    callable: it extends the first call)."""
    claude = client.anthropic
    messages = [{"role": "user", "content": problem.prompt}]
    async with claude.messages.stream(model="policy", max_tokens=40, system=SYSTEM,
                                      tools=[CALCULATE], messages=messages,
                                      tool_choice={"type": "tool", "name": "calculate"}) as stream:
        first = await stream.get_final_message()
    STREAMED.append(first)
    uses = [b for b in first.content if b.type == "tool_use"]
    if first.stop_reason != "tool_use" or not uses:
        return {"reward": 0.0, "tool_use": 0}
    messages += [{"role": "assistant", "content": first.content},
                 {"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": u.id, "content": "7"} for u in uses]}]
    async with claude.messages.stream(model="policy", max_tokens=8, system=SYSTEM,
                                      tools=[CALCULATE], tool_choice={"type": "none"},
                                      messages=messages) as stream:
        final = await stream.get_final_message()
    STREAMED.append(final)
    return {"reward": 1.0, "tool_use": 1}

def three_calls_sync(client, problem):
    """three_calls with a synchronous ``openai.OpenAI`` client, in the worker's agent threads."""
    messages = [{"role": "user", "content": problem.prompt}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                           max_tokens=6)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "Go on."}]
    stream = client.chat.completions.create(model="policy", messages=messages, max_tokens=6,
                                            stream=True)
    text = "".join([c.choices[0].delta.content or "" for c in stream if c.choices])
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Once more."}]
    last = client.chat.completions.create(model="policy", messages=messages, max_tokens=6, n=2)
    assert len(last.choices) == 2
    return {"reward": 1.0, "choices": len(last.choices)}


async def three_calls_blocking(client, problem):
    """three_calls, marked blocking: run in a thread, in an event loop of its own."""
    return await three_calls(client, problem)


three_calls_blocking.blocking = True


def _one_call(client, problem):
    client.chat.completions.create(model="policy", max_tokens=2,
                                   messages=[{"role": "user", "content": problem.prompt}])


def sleeps_sync(client, problem):
    """One call, then (a problem whose meta says so) a blocking sleep of meta["sleep"] seconds."""
    _one_call(client, problem)
    time.sleep(problem.meta.get("sleep", 0))
    return 1.0


async def sleeps_blocking(client, problem):
    """sleeps_sync as an async agent marked blocking: time.sleep stalls only its own thread."""
    await client.chat.completions.create(model="policy", max_tokens=2,
                                         messages=[{"role": "user", "content": problem.prompt}])
    time.sleep(problem.meta.get("sleep", 0))
    return 1.0


sleeps_blocking.blocking = True


def raises_sync(client, problem):
    _one_call(client, problem)
    raise RuntimeError("the agent's own bug")


def hangs_sync(client, problem):
    _one_call(client, problem)
    time.sleep(3600)


async def sleeps_async_unmarked(client, problem):
    """sleeps_blocking not marked: its time.sleep holds the endpoint's loop (what not to do)."""
    return await sleeps_blocking(client, problem)


async def constrained_replies(client, problem):
    """A JSON reply by response_format (chat), by text.format (Responses), and a call Anthropic's
    tool_choice any requires: each must come back as asked."""
    import json

    msgs = [{"role": "user", "content": problem.prompt}]
    fmt = {"type": "json_schema", "json_schema": {"name": "small", "schema": SMALL}}
    chat = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=40,
                                                response_format=fmt)
    reply = json.loads(chat.choices[0].message.content)
    r = await client.responses.create(model="policy", input=problem.prompt, max_output_tokens=40,
                                      text={"format": {"type": "json_schema", "name": "small",
                                                       "schema": SMALL}})
    second = json.loads(r.output_text)
    m = await client.anthropic.messages.create(
        model="policy", max_tokens=40, messages=msgs, tool_choice={"type": "any"},
        tools=[{"name": "calculate", "input_schema": {"type": "object", "properties": {}}}])
    uses = [b for b in m.content if b.type == "tool_use"]
    ok = all(set(x) == {"n", "ok"} and 0 <= x["n"] <= 9 for x in (reply, second))
    return 1.0 if ok and len(uses) == 1 and m.stop_reason == "tool_use" else 0.0


QUESTIONS = ["What is 17 * 3 - 5?", "What is 24 * 4 - 7?", "What is 31 + 12 * 2?"]
ANSWER = {"type": "object", "required": ["answer", "confidence"],
          "properties": {"answer": {"type": "integer"}, "confidence": {"enum": ["low", "high"]}}}
ASK_JSON = 'Reply with JSON only: {"answer": <integer>, "confidence": "low" or "high"}.'


def _is_answer(text) -> bool:
    import json

    try:
        obj = json.loads(text or "")
    except ValueError:
        return False
    return (isinstance(obj, dict) and set(obj) == {"answer", "confidence"}
            and isinstance(obj["answer"], int) and obj["confidence"] in ("low", "high"))


async def constrained_or_not(client, problem):
    """Per question, 4 samples each of: a call tool_choice requires and the same with tool_choice
    auto; a reply response_format holds to a schema and the same JSON only asked for in the
    prompt. Returns how many of each came back as asked (a parsed calculate call, JSON of the
    schema)."""
    import json

    tools = [{"type": "function", "function": {
        "name": CALCULATE["name"], "description": CALCULATE["description"],
        "parameters": CALCULATE["input_schema"]}}]
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    calls, out = [], {"reward": 0.0, "calls": 0, "free_calls": 0, "json": 0, "free_json": 0}

    async def call(key, **body):  # 4 samples of one request; how many came back as asked
        r = await client.chat.completions.create(model="policy", max_tokens=96, n=4, **body)
        if key.endswith("calls"):
            out[key] += sum(len(c.message.tool_calls or []) == 1 and isinstance(json.loads(
                c.message.tool_calls[0].function.arguments).get("expression"), str)
                for c in r.choices)
        else:
            out[key] += sum(_is_answer(c.message.content) for c in r.choices)

    for q in QUESTIONS:
        msgs = [{"role": "user", "content": q}]
        asked = [{"role": "user", "content": f"{q} {ASK_JSON}"}]
        calls += [call("calls", messages=msgs, tools=tools, tool_choice="required"),
                  call("free_calls", messages=msgs, tools=tools, tool_choice="auto"),
                  call("json", messages=asked, response_format=fmt),
                  call("free_json", messages=asked)]
    await asyncio.gather(*calls)  # at once: the engine batches them
    return out

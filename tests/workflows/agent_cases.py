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


async def exits_when_told(client, problem):
    """One call, then (where its problem's meta says so) its whole process ends with code 3: run in
    an agent process only."""
    import os

    await client.chat.completions.create(model="policy",
                                         messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    if problem.meta.get("exit"):
        os._exit(3)
    return 1.0


async def writes_a_bad_frame(client, problem):
    """In an agent process: one call, then a frame of its own into the socket to the worker (the
    process's argv names its descriptor), as hostile code there could."""
    import os
    import struct
    import sys

    await client.chat.completions.create(model="policy",
                                         messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    os.write(int(sys.argv[2]), struct.pack(">I", 2) + b"[]")
    await asyncio.sleep(3600)


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
    """One call of its own, then calls into the episode beside it (the sibling's key guessed from
    its own: group and index known, the secret not). From outside every episode's context, as
    another process would, the endpoint must refuse them; from the agent's own code, the call is
    recorded into its own episode, never the URL's."""
    import contextvars

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
        call = other.chat.completions.create(model="policy", max_tokens=3,
                                             messages=[{"role": "user", "content": "x"}])
        try:
            await asyncio.create_task(call, context=contextvars.Context())  # no episode's
            return {"reward": 0.0, "wrote_into": guess}
        except openai.NotFoundError:
            pass
        finally:
            await other.close()
    async with openai.AsyncOpenAI(base_url=base.replace(key, sibling), api_key=client.api_key,
                                  max_retries=0) as other:
        await other.chat.completions.create(model="policy", max_tokens=3,
                                            messages=[{"role": "user", "content": "y"}])
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


# ---- logprobs, the Responses API's streams and chains, the episode's clock ----

ANSWERED: list = []  # (kind, what the agent was answered, ...) of the agents below
RESPONSES_INCLUDE = ["message.output_text.logprobs"]


async def logprobs_everywhere(client, problem):
    """Chat (n=2), a streamed chat and the Responses API, each asking for the sampled tokens'
    logprobs; what each returned is kept in ANSWERED."""
    messages = [{"role": "user", "content": problem.prompt}]
    chat = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6,
                                                n=2, logprobs=True)
    for c in chat.choices:
        ANSWERED.append(("chat", c.message.content, [t.logprob for t in c.logprobs.content]))
    stream = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Count."}], max_tokens=5,
        logprobs=True, stream=True)
    text, lps = "", []
    async for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            lps += [t.logprob for t in (c.logprobs.content if c.logprobs else None) or []]
    ANSWERED.append(("chat_stream", text, lps))
    r = await client.responses.create(model="policy", input="Say hi.", max_output_tokens=5,
                                      include=RESPONSES_INCLUDE)
    part = r.output[0].content[0]
    ANSWERED.append(("responses", part.text, [t.logprob for t in part.logprobs]))
    return 1.0


async def responses_chain(client, problem):
    """Three Responses calls chained by previous_response_id (the same instructions on each): a
    plain one, one streamed by ``responses.stream`` and one by ``create(stream=True)``."""
    kw = {"model": "policy", "instructions": "Answer briefly.", "max_output_tokens": 5,
          "include": RESPONSES_INCLUDE}
    first = await client.responses.create(input=problem.prompt, **kw)
    async with client.responses.stream(input="Go on.", previous_response_id=first.id,
                                       **kw) as stream:
        kinds = [e.type async for e in stream]
        second = await stream.get_final_response()
    events = await client.responses.create(input="Once more.", previous_response_id=second.id,
                                           stream=True, **kw)
    raw = [e async for e in events]
    third = raw[-1].response
    ANSWERED.append(("chain", [first, second, third], kinds, [e.type for e in raw]))
    return 1.0


async def responses_unknown_previous(client, problem):
    """A previous_response_id of no response of this episode (made up, another episode's, or one
    sent with store=false): 404 previous_response_not_found each time."""
    import openai

    kept = await client.responses.create(model="policy", input="hi", max_output_tokens=2)
    unkept = await client.responses.create(model="policy", input="hi", max_output_tokens=2,
                                           store=False)
    answers = []
    for rid in ("resp_made_up", unkept.id):
        try:
            await client.responses.create(model="policy", input="x", max_output_tokens=2,
                                          previous_response_id=rid)
            answers.append(None)
        except openai.NotFoundError as err:
            answers.append((err.status_code, err.code, err.param))
    ANSWERED.append(("unknown", kept.id, answers))
    return 1.0


async def held_then_sleeps(client, problem):
    """One call, then meta["sleep"] seconds of the agent's own time (asyncio.sleep)."""
    await client.chat.completions.create(model="policy", max_tokens=2,
                                         messages=[{"role": "user", "content": problem.prompt}])
    await asyncio.sleep(problem.meta.get("sleep", 0))
    return 1.0


FAILED_ONCE = iter(range(1 << 30))


async def first_of_each_pair_fails(client, problem):
    """One call each; the first episode of every two to run raises after it (meta["no_call"]:
    before it)."""
    fails = next(FAILED_ONCE) % 2 == 0
    if fails and problem.meta.get("no_call"):
        raise RuntimeError("failed before its first call")
    await client.chat.completions.create(model="policy", max_tokens=3,
                                         messages=[{"role": "user", "content": problem.prompt}])
    if fails:
        raise RuntimeError("failed after its call")
    return 1.0

# ---- process-wide clients: not the one the agent is handed ----

SHARED: dict = {}  # what every episode of the process sees


def _follow_up(messages, reply):
    """The messages of a call extending the one that got ``reply``."""
    return messages + [{"role": "assistant", "content": reply.choices[0].message.content},
                       {"role": "user", "content": "Go on."}]


def module_client_sync(client, problem):
    """The openai module's own client, pointed at the episode of the first agent that ran: every
    later episode calls through a URL naming another episode (ended, at times)."""
    import openai

    endpoint = str(client.base_url).split("/episodes/")[0]
    if SHARED.get("module_client_of") != endpoint:  # the first episode of this endpoint
        SHARED["module_client_of"] = endpoint
        openai.base_url, openai.api_key, openai.max_retries = client.base_url, client.api_key, 0
    messages = [{"role": "user", "content": problem.prompt}]
    reply = openai.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    time.sleep(0.01)  # the other episodes' calls come between
    openai.chat.completions.create(model="policy", messages=_follow_up(messages, reply),
                                   max_tokens=4)
    return 1.0


async def environment_client(client, problem):
    """A client built from the environment (OPENAI_BASE_URL: the worker's plain /v1), once per
    endpoint of the process as a module-level one is once per worker."""
    import os

    import openai

    shared = SHARED.setdefault(os.environ["OPENAI_BASE_URL"], openai.AsyncOpenAI(max_retries=0))
    messages = [{"role": "user", "content": problem.prompt}]
    reply = await shared.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    await asyncio.sleep(0.01)
    await shared.chat.completions.create(model="policy", messages=_follow_up(messages, reply),
                                         max_tokens=4)
    return 1.0


async def default_set_by_each(client, problem):
    """Each episode sets the process-wide default to its own client and calls through the default
    (as with a framework's set_default_openai_client): the last setter's URL serves them all. The
    second call from a thread started by asyncio.to_thread, with a synchronous client."""
    import openai

    SHARED["default"] = client
    await asyncio.sleep(0.01)  # the other episodes set theirs meanwhile
    messages = [{"role": "user", "content": problem.prompt}]
    reply = await SHARED["default"].chat.completions.create(model="policy", messages=messages,
                                                            max_tokens=4)
    url = SHARED["default"].base_url
    sync = openai.OpenAI(base_url=url, api_key=client.api_key, max_retries=0)
    await asyncio.to_thread(sync.chat.completions.create, model="policy", max_tokens=4,
                            messages=_follow_up(messages, reply))
    sync.close()
    return 1.0


async def sync_client_in_the_loop(client, problem):
    """The openai module's synchronous client called from an async agent: it would block the loop
    that serves it."""
    import openai

    openai.base_url, openai.api_key, openai.max_retries = client.base_url, client.api_key, 0
    openai.chat.completions.create(model="policy", max_tokens=2,
                                   messages=[{"role": "user", "content": problem.prompt}])
    return 1.0


# ---- agents that rewrite their history ----

async def summarise_then_answer(client, problem):
    """examples/agents/summarise_then_answer.py: work, its summary (extending it), then the answer
    in a fresh context holding the summary alone."""
    from examples.agents.summarise_then_answer import run

    return await run(client, problem)


async def with_a_subagent(client, problem):
    """A call, a subagent's call in a fresh context of its own, then the parent's answer from the
    subagent's report (extending the parent's call): the parent's trajectory makes the last call,
    though the subagent's began after it."""
    messages = [{"role": "user", "content": problem.prompt}]
    plan = await client.chat.completions.create(model="policy", max_tokens=4, messages=messages)
    report = await client.chat.completions.create(model="policy", max_tokens=4, messages=[
        {"role": "user", "content": "Check: 3 + 4"}])
    messages += [{"role": "assistant", "content": plan.choices[0].message.content},
                 {"role": "user", "content": f"A helper says: {report.choices[0].message.content}"}]
    await client.chat.completions.create(model="policy", max_tokens=4, messages=messages)
    return 1.0


def anthropic_sync(client, problem):
    """examples/agents/anthropic_sync.py: a process-wide anthropic.Anthropic from the environment,
    in the worker's agent threads."""
    from examples.agents.anthropic_sync import run

    return run(client, problem)


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

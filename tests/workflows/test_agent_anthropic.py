"""Anthropic's Messages API on the agent endpoint, driven by the real ``anthropic`` client against
the embedded engine: an agent's tool_use answered with a tool_result, every engine sequence recorded
as generated, the client's stream parser fed the endpoint's events; and Anthropic's error shapes for
every way a request can be wrong."""

from __future__ import annotations

import json

import agent_cases
import anthropic
import httpx
import pytest
from agent_harness import drive, holds, item, serve_while
from conftest import hf_engine

from areal_cli.config.schema import RootConfig, WorkflowConfig
from areal_cli.model_source import resolve_model
from areal_cli.rewards import RewardPool
from areal_cli.tasks import load_tokenizer
from areal_cli.workflows.agent.workflow import AgentWorkflow

MSG = [{"role": "user", "content": "hi"}]


def _flow(model, agent: str, max_new_tokens: int, temperature: float = 1.0, **workflow):
    eng = hf_engine(model, temperature=temperature, sequences=16, kv_cache_tokens=8192)
    pool = RewardPool(RootConfig().reward, 1)
    cfg = WorkflowConfig(name="agent", agent=f"agent_cases:{agent}", max_turns=4, **workflow)
    flow = AgentWorkflow(cfg, eng, pool, load_tokenizer(model), 0, model="tiny",
                         max_new_tokens=max_new_tokens, context=2048)
    return flow, eng, pool


@pytest.fixture
def tiny(tiny_model):
    flow, eng, pool = _flow(tiny_model, "no_call", 8)
    yield flow, eng
    flow.close()
    eng.close()
    pool.close()


def test_an_anthropic_agents_tool_use_and_tool_result_are_recorded_as_generated_and_streamed():
    """The default model, greedy: the first call must use `calculate` (decoded under the call's
    grammar, which ends it after </tool_call>); the agent answers the tool_use with a
    tool_result in a second call, which extends the first: one trajectory holding both calls'
    sampled ids exactly. Both calls are streamed, and the client's parser builds the tool_use and
    the recorded tokens' text from the events."""
    agent_cases.STREAMED.clear()
    flow, eng, pool = _flow(resolve_model("smollm2-135m-instruct"), "anthropic_tool", 48,
                            temperature=0.0)
    try:
        flow.start(item(0, size=1))
        [g], seen = drive(flow, eng, 1, timeout_s=300)
    finally:
        flow.close()
        eng.close()
        pool.close()
    assert not g.failed and g.counters["agent_extra_tool_use"] == 1, g.counters
    assert g.counters["agent_calls"] == 2 and g.counters["agent_tool_calls"] == 1
    assert g.counters["agent_splits"] == 0 and len(g.samples) == 1  # the second extends the first
    first, second = sorted(seen, key=lambda s: len(s.prompt_ids))
    # the first call's reply is the whole call, then the end of sequence the grammar leaves
    assert flow.tok.decode(first.output_ids).endswith("</tool_call><|im_end|>") and first.grammar
    kept = len(first.output_ids)
    assert holds(g.samples[0], first) and holds(g.samples[0], second)
    asked, final = agent_cases.STREAMED
    # the tool_use reached the client's stream parser as input_json_delta: its input, an object
    [use] = [b for b in asked.content if b.type == "tool_use"]
    assert use.name == "calculate" and use.id.startswith("toolu_") and "expression" in use.input
    assert asked.stop_reason == "tool_use" and asked.usage.output_tokens == kept
    recorded = flow.tok.decode(second.output_ids, skip_special_tokens=True)
    text = "".join(b.text for b in final.content if b.type == "text")
    assert text == recorded and final.usage.output_tokens == len(second.output_ids)
    assert final.stop_reason in ("end_turn", "max_tokens")


def test_a_messages_call_and_its_stream_through_the_anthropic_client(tiny):
    flow, eng = tiny
    out = {}

    def calls():
        client = anthropic.Anthropic(base_url=flow.url.removesuffix("/v1"),
                                     api_key=flow.endpoint.token, max_retries=0)
        m = client.messages.create(model="m", max_tokens=3, messages=MSG, system="Be brief.")
        out["create"] = (m.type, m.role, m.stop_reason, m.usage.output_tokens, m.id[:4])
        with client.messages.stream(model="m", max_tokens=3, messages=MSG) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_message()
        out["stream"] = (kinds[0], kinds[-1], final.stop_reason, final.usage.output_tokens)
        out["count"] = client.messages.count_tokens(model="m", messages=MSG).input_tokens
        out["models"] = [m.id for m in client.models.list()]

    serve_while(flow, eng, calls)
    assert out["create"] == ("message", "assistant", "max_tokens", 3, "msg_")
    assert out["stream"] == ("message_start", "message_stop", "max_tokens", 3)
    hi = flow.endpoint.renderer
    assert out["count"] == len(hi.encode(hi.text(MSG, None, generation=True)))
    assert out["models"] == ["tiny"]


def _post(flow, body, headers=None, path="/messages"):
    r = httpx.post(flow.url + path, headers=headers or {"x-api-key": flow.endpoint.token},
                   content=body if isinstance(body, bytes) else json.dumps(body), timeout=30)
    return r.status_code, r.json()


TOOL = {"name": "calculate", "input_schema": {"type": "object", "properties": {}}}
USE = {"type": "tool_use", "id": "toolu_1", "name": "calculate", "input": {"expression": "1"}}
ASKED = [{"role": "user", "content": "2?"}, {"role": "assistant", "content": [USE]}]


def _result(tool_use_id="toolu_1", **extra):
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use_id,
                                         **extra}]}


# every hostile body: 400 invalid_request_error naming its field
HOSTILE = {
    "no max_tokens": ({"messages": MSG}, "max_tokens"),
    "max_tokens 0": ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    "not an object": ([1, 2], "body"),
    "no messages": ({"max_tokens": 4, "messages": []}, "messages"),
    "a system role": ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
                      "messages[0]"),
    "an image block": ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    "a block without a type": ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"text": "x"}]}]}, "messages[0].content[0]"),
    "text not a string": ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": 3}]}]}, "messages[0].content[0].text"),
    "a tool_use from the user": ({"max_tokens": 4, "messages": [{"role": "user",
                                                                 "content": [USE]}]},
                                 "messages[0].content[0]"),
    "a tool_result for no tool_use": ({"max_tokens": 4, "messages": [_result()]},
                                      "messages[0].content[0].tool_use_id"),
    "a tool_result of another id": ({"max_tokens": 4, "messages": ASKED + [_result("toolu_2")]},
                                    "messages[2].content[0].tool_use_id"),
    "a tool_use left unanswered": ({"max_tokens": 4, "messages": ASKED + MSG}, "messages[2]"),
    "a tool_use input not an object": ({"max_tokens": 4, "messages": [
        ASKED[0], {"role": "assistant", "content": [{**USE, "input": "1"}]}, _result()]},
        "messages[1].content[0].input"),
    "a repeated tool_use id": ({"max_tokens": 4, "messages": ASKED + [
        _result(), {"role": "assistant", "content": [USE]}, _result()]},
        "messages[3].content[0].id"),
    "a tool_use_id not a string": ({"max_tokens": 4, "messages": ASKED + [_result(["x"])]},
                                   "messages[2].content[0].tool_use_id"),
    "is_error not a bool": ({"max_tokens": 4, "messages": ASKED + [_result(is_error="yes")]},
                            "messages[2].content[0].is_error"),
    "a tool_result holding an image": ({"max_tokens": 4, "messages": ASKED + [
        _result(content=[{"type": "image"}])]}, "messages[2].content[0].content"),
    "a prefill": ({"max_tokens": 4, "messages": MSG + [{"role": "assistant", "content": "I"}]},
                  "messages[1]"),
    "an input_schema not an object": ({"max_tokens": 4, "messages": MSG, "tools": [
        {"name": "calculate", "input_schema": "{}"}]}, "tools[0].input_schema"),
    "a server tool": ({"max_tokens": 4, "messages": MSG, "tools": [
        {"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    "two tools of one name": ({"max_tokens": 4, "messages": MSG, "tools": [TOOL, TOOL]},
                              "tools[1].name"),
    "tool_choice naming no tool": ({"max_tokens": 4, "messages": MSG, "tools": [TOOL],
                                    "tool_choice": {"type": "tool", "name": "search"}},
                                   "tool_choice"),
    "tool_choice any without tools": ({"max_tokens": 4, "messages": MSG,
                                       "tool_choice": {"type": "any"}}, "tool_choice"),
    "tool_choice of a list type": ({"max_tokens": 4, "messages": MSG,
                                    "tool_choice": {"type": ["auto"]}}, "tool_choice"),
    "tool_choice a string": ({"max_tokens": 4, "messages": MSG, "tool_choice": "auto"},
                             "tool_choice"),
    "a system of images": ({"max_tokens": 4, "messages": MSG, "system": [{"type": "image"}]},
                           "system"),
    "stop_sequences a string": ({"max_tokens": 4, "messages": MSG, "stop_sequences": "x"},
                                "stop_sequences"),
}


def test_every_hostile_body_is_a_400_in_anthropics_shape_naming_its_field(tiny):
    flow, _ = tiny
    for why, (body, field) in HOSTILE.items():
        status, got = _post(flow, body)
        assert status == 400 and got["type"] == "error", (why, got)
        assert got["error"]["type"] == "invalid_request_error", (why, got)
        assert got["error"]["message"].startswith(f"{field}: "), (why, got)
    assert flow.endpoint.counters["agent_bad_requests"] == len(HOSTILE)
    assert not flow.endpoint.unattributed and not flow.bridge.in_flight()  # none reached the engine


def test_refusals_come_back_in_anthropics_shape_with_their_status(tiny):
    """The same failures the chat path refuses: the SDK's exception and error type for each."""
    flow, eng = tiny
    out = {}
    base = flow.url.removesuffix("/v1")

    def calls():
        good = anthropic.Anthropic(base_url=base, api_key=flow.endpoint.token, max_retries=0)
        bad = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
        for name, call, kind in [
            ("key", lambda: bad.messages.create(model="m", max_tokens=2, messages=MSG),
             anthropic.AuthenticationError),
            # the client's own signature needs max_tokens: the body sent as it is
            ("max_tokens", lambda: good.post("/v1/messages", body={"model": "m", "messages": MSG},
                                             cast_to=object), anthropic.BadRequestError),
            ("context", lambda: good.messages.create(model="m", max_tokens=2, messages=[
                {"role": "user", "content": "x " * 3000}]), anthropic.BadRequestError),
            ("episode", lambda: anthropic.Anthropic(
                base_url=f"{base}/episodes/0-0-guess", api_key=flow.endpoint.token,
                max_retries=0).messages.create(model="m", max_tokens=2, messages=MSG),
             anthropic.NotFoundError),
        ]:
            try:
                call()
            except kind as err:
                out[name] = (err.status_code, err.body["type"], err.body["error"]["type"])
        headers = {"x-api-key": flow.endpoint.token}
        out["large"] = _post(flow, b" " * (5 << 20), headers)
        out["json"] = _post(flow, b"{", headers)
        out["bearer"] = _post(flow, {"max_tokens": 2, "messages": MSG},
                              {"authorization": f"Bearer {flow.endpoint.token}"})[0]
        out["x-api-key wrong"] = _post(flow, {"max_tokens": 2, "messages": MSG},
                                       {"x-api-key": "wrong"})

    serve_while(flow, eng, calls, timeout_s=60)
    assert out["key"] == (401, "error", "authentication_error")
    assert out["max_tokens"] == (400, "error", "invalid_request_error")
    assert out["context"] == (400, "error", "invalid_request_error")
    assert out["episode"] == (404, "error", "not_found_error")
    assert out["large"][0] == 413 and out["large"][1]["error"]["type"] == "request_too_large"
    assert out["json"][0] == 400 and out["json"][1]["error"]["type"] == "invalid_request_error"
    assert out["bearer"] == 200
    assert out["x-api-key wrong"][0] == 401
    assert out["x-api-key wrong"][1]["error"]["type"] == "authentication_error"
    assert flow.endpoint.counters["agent_unauthorized"] == 2


def test_calls_outside_an_episode_past_the_budget_are_a_rate_limit_error(tiny_model):
    flow, eng, pool = _flow(tiny_model, "no_call", 8, agent_unattributed_sequences=0)
    try:
        status, body = _post(flow, {"max_tokens": 2, "messages": MSG})
    finally:
        flow.close()
        eng.close()
        pool.close()
    assert status == 429 and body["error"]["type"] == "rate_limit_error"


def test_a_tool_conversation_in_anthropics_blocks_renders_as_the_same_chat():
    """The conversion: system blocks, tool_use → tool calls, tool_result (is_error) → tool
    messages, tool_choice → chat's."""
    from areal_cli.workflows.agent import requests as rq
    from areal_cli.workflows.agent.anthropic_api import messages_request

    body = {"max_tokens": 5, "system": [{"type": "text", "text": "Use "}, {"type": "text",
                                                                          "text": "tools."}],
            "tools": [{**TOOL, "description": "Arithmetic."}], "stop_sequences": ["\n\n"],
            "tool_choice": {"type": "tool", "name": "calculate"},
            "messages": ASKED + [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                 "content": [{"type": "text", "text": "no"}]},
                {"type": "text", "text": "Try again."}]}]}
    req = messages_request(body)
    chat = rq.chat_request({"max_tokens": 5, "stop": ["\n\n"], "messages": [
        {"role": "system", "content": "Use tools."}, ASKED[0],
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "calculate", "arguments": '{"expression": "1"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no"},
        {"role": "user", "content": "Try again."}],
        "tools": [{"type": "function", "function": {
            "name": "calculate", "description": "Arithmetic.",
            "parameters": TOOL["input_schema"]}}],
        "tool_choice": {"type": "function", "function": {"name": "calculate"}}})
    assert req == chat
    for kind, want in (("auto", "auto"), ("any", "required"), ("none", "none")):
        assert messages_request({**body, "tool_choice": {"type": kind}}).tool_choice == want

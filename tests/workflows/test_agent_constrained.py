"""Constrained replies on the agent endpoint: what a request asks for (tool_choice required or a
named tool, response_format, the Responses API's text.format, Anthropic's tool_choice any / tool)
becomes a grammar llguidance compiles, a schema it cannot is refused naming the field, and through
the real clients a random-weight model (which never writes a call or JSON by itself) returns what
was asked; workflow.constrained_tokens decides whether those tokens are trained."""

from __future__ import annotations

import functools
import json

import llguidance
import llguidance.hf
import pytest
from agent_harness import agent_setup, drive, item
from transformers import AutoTokenizer

from areal_cli.config.choices import ToolFormat
from areal_cli.workflows.agent import anthropic_api as am
from areal_cli.workflows.agent import requests as rq
from areal_cli.workflows.agent.constraints import closed, reply_grammar
from areal_cli.workflows.agent.toolcalls import ToolStyle, parse

HERMES, LLAMA = ToolStyle(ToolFormat.hermes, False), ToolStyle(ToolFormat.llama3_json, True)
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]}}},
         {"type": "function", "function": {"name": "stop"}}]


@functools.cache
def _tokenizers():
    from areal_cli.model_source import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    return tok, llguidance.hf.from_tokenizer(tok)


def _accepts(grammar: str, text: str) -> bool:
    """Whether ``grammar`` takes ``text`` whole, token by token (the default model's tokens)."""
    tok, ll = _tokenizers()
    m = llguidance.LLMatcher(ll, grammar, log_level=0)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return m.consume_tokens(ids) and m.is_accepting()


def _chat(**body):
    return rq.chat_request({"messages": [{"role": "user", "content": "hi"}], **body})


@pytest.mark.parametrize("style", [HERMES, LLAMA])
def test_a_required_call_is_one_call_in_the_models_format_with_its_tools_schema(style):
    g = reply_grammar(style, _chat(tools=TOOLS, tool_choice="required"))
    key = "arguments" if style is HERMES else "parameters"
    good = json.dumps({"name": "add", key: {"a": 1, "b": 2}})
    wrap = (lambda x: f"<tool_call>\n{x}\n</tool_call>") if style is HERMES else (lambda x: x)
    assert _accepts(g, wrap(good)) and _accepts(g, wrap(json.dumps({"name": "stop", key: {}})))
    [call] = parse(style, wrap(good)).tool_calls  # what the grammar takes, the parser reads
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
    for bad in ({"name": "add", key: {"a": 1}},  # a required argument missing
                {"name": "add", key: {"a": 1, "b": 2, "c": 3}},  # one the schema does not list
                {"name": "mul", key: {"a": 1, "b": 2}},  # a tool not offered
                {"name": "add", key: {"a": "1", "b": 2}}):  # a string for an integer
        assert not _accepts(g, wrap(json.dumps(bad))), bad
    assert not _accepts(g, "Sure! " + wrap(good))  # no text before the call
    named = reply_grammar(style, _chat(tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": "stop"}}))
    assert not _accepts(named, wrap(good)) and _accepts(named, wrap(json.dumps(
        {"name": "stop", key: {}})))


def test_response_formats_of_each_api_become_the_json_they_ask_for():
    schema = {"type": "object", "properties": {"x": {"enum": ["a", "b"]}}, "required": ["x"]}
    chat = _chat(response_format={"type": "json_schema", "json_schema": {"name": "s",
                                                                         "schema": schema}})
    assert chat.response_schema == schema
    g = reply_grammar(HERMES, chat)
    assert _accepts(g, '{"x": "a"}') and not _accepts(g, '{"x": "c"}')
    assert not _accepts(g, '{"x": "a", "y": 1}')  # closed, as OpenAI's strict mode
    anything = reply_grammar(HERMES, _chat(response_format={"type": "json_object"}))
    assert _accepts(anything, '{"y": [1, 2]}') and not _accepts(anything, "[1]")
    assert reply_grammar(HERMES, _chat(response_format={"type": "text"})) == ""
    body = {"input": "hi", "text": {"format": {"type": "json_schema", "name": "s",
                                               "schema": schema}}}
    from areal_cli.workflows.agent import responses as rs

    assert rq.chat_request(rs.responses_request(body).as_chat([])).response_schema == schema
    # with tools offered and tool_choice auto: the JSON, or a call
    both = reply_grammar(HERMES, _chat(tools=TOOLS, response_format={"type": "json_object"}))
    assert _accepts(both, '{"y": 1}') and _accepts(
        both, '<tool_call>\n{"name": "stop", "arguments": {}}\n</tool_call>')


def test_anthropics_tool_choices_constrain_like_openais():
    tools = [{"name": "add", "input_schema": TOOLS[0]["function"]["parameters"]}]
    msgs = [{"role": "user", "content": "hi"}]
    for choice, name in (({"type": "any"}, None), ({"type": "tool", "name": "add"}, "add")):
        req = am.messages_request({"max_tokens": 9, "messages": msgs, "tools": tools,
                                   "tool_choice": choice})
        assert req.tool_choice == "required" and req.tool_name == name
        assert _accepts(reply_grammar(HERMES, req),
                        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
     "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strnig"}}}}}], "tool_choice": "required"},
     "tools")])
def test_a_schema_that_cannot_be_enforced_is_refused_naming_the_field(body, param):
    with pytest.raises(rq.ApiError) as err:
        reply_grammar(HERMES, _chat(**body))
    assert err.value.status == 400 and err.value.param == param


def test_a_schema_nested_past_the_stack_is_a_400_not_a_crash():
    deep: dict = {"type": "object"}
    for _ in range(900):  # within what the body's JSON parser takes
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(rq.ApiError, match="nested too deep") as err:
        reply_grammar(HERMES, _chat(response_format={"type": "json_schema",
                                                     "json_schema": {"schema": deep}}))
    assert err.value.param == "response_format"


def test_closed_closes_every_object_that_lists_properties_and_keeps_what_a_schema_says():
    s = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}},
                                          "c": {"type": "array", "items": {
                                              "type": "object", "properties": {}}},
                                          "d": {"type": "object", "properties": {},
                                                "additionalProperties": True}}}
    out = closed(s)
    assert out["additionalProperties"] is False
    assert out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["c"]["items"]["additionalProperties"] is False
    assert out["properties"]["d"]["additionalProperties"] is True
    assert "additionalProperties" not in s  # a copy


@pytest.fixture
def setup(tiny_model):
    yield from agent_setup(tiny_model)


@pytest.mark.parametrize("tokens", ["train", "mask"])
def test_a_random_model_returns_what_each_api_asked_for(setup, tokens):
    """Chat's response_format, Responses' text.format and Anthropic's tool_choice any, through the
    real clients; the constrained tokens train (loss mask 1) or not, as workflow.constrained_tokens
    says."""
    eng, make = setup
    flow = make("constrained_replies", max_new_tokens=40, constrained_tokens=tokens)
    flow.start(item(0, size=1))
    [g], seen = drive(flow, eng, 1)
    assert not g.failed and all(s.reward == 1.0 for s in g.samples)
    assert len(seen) == 3 and all(s.grammar for s in seen)
    trained = sum(int(s.loss_mask.sum()) for s in g.samples)
    assert trained == (sum(len(s.output_ids) for s in seen) if tokens == "train" else 0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_the_default_model_always_returns_a_parsed_call_and_json_of_the_schema(seed):
    """The acceptance: SmolLM2-135M-Instruct at the run's sampling (temperature 1), three questions,
    4 samples each: every call tool_choice requires parses, every response_format reply is JSON of
    its schema, where the same model unconstrained (tool_choice auto; the JSON asked for in the
    prompt) fails on some of the same requests."""
    import torch

    from areal_cli.model_source import resolve_model

    torch.manual_seed(seed)
    setup = agent_setup(resolve_model("smollm2-135m-instruct"))
    eng, make = next(setup)
    try:
        flow = make("constrained_or_not", max_new_tokens=96, max_turns=12, agent_timeout_s=1800.0)
        flow.start(item(0, size=1))
        [g], _ = drive(flow, eng, 1, timeout_s=1800)
    finally:
        next(setup, None)  # the harness's teardown: the workflows, the engine, the reward pool
    c = {k.removeprefix("agent_extra_"): v for k, v in g.counters.items()}
    assert not g.failed and c["calls"] == 12 and c["json"] == 12, c
    assert c["free_calls"] < 12 and c["free_json"] < 12, c

"""Logprobs on request and the Responses API's streams and chains, through the official ``openai``
client against the endpoint on the tiny model (real HTTP, the real engine): every returned logprob
is the engine's behaviour logprob the trainer receives, and a chain of streamed calls linked by
previous_response_id is one token-exact trajectory."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from agent_cases import ANSWERED
from agent_harness import agent_setup, drive, holds, item, serve_while


@pytest.fixture
def setup(tiny_model):
    ANSWERED.clear()
    yield from agent_setup(tiny_model)


def _span(sample, seq) -> slice:
    """Where ``seq``'s sampled tokens sit in ``sample``'s output (``holds(sample, seq)``)."""
    start = len(seq.prompt_ids) - len(sample.prompt_ids)
    return slice(start, start + len(seq.output_ids))


def test_returned_logprobs_are_the_recorded_behaviour_logprobs(setup):
    """Chat (n=2), a streamed chat and a Responses call with logprobs: each answer's logprobs are
    one engine sequence's, exactly, and equal the logprobs its trajectory trains with."""
    eng, make = setup
    flow = make("logprobs_everywhere")
    flow.start(item(0, size=1))
    [g], seen = drive(flow, eng, 1)
    assert not g.failed and [a[0] for a in ANSWERED] == ["chat", "chat", "chat_stream",
                                                         "responses"]
    assert len(seen) == 4
    for kind, text, lps in ANSWERED:
        [seq] = [s for s in seen if list(s.logprobs) == lps]  # the engine's numbers, exactly
        assert len(lps) == len(seq.output_ids) > 0, kind
        assert text == flow.tok.decode(seq.output_ids, skip_special_tokens=True), kind
        [sample] = [s for s in g.samples if holds(s, seq)]
        assert sample.logprobs[_span(sample, seq)].tolist() == np.float32(lps).tolist(), kind


def test_logprob_requests_the_engine_cannot_answer_are_refused_naming_why(setup):
    eng, make = setup
    flow = make("no_call")
    out = {}

    def calls():
        client = openai.OpenAI(base_url=flow.url, api_key=flow.endpoint.token, max_retries=0)
        msg = [{"role": "user", "content": "hi"}]
        for name, kw in {"top": {"logprobs": True, "top_logprobs": 3},
                         "no_logprobs": {"top_logprobs": 3}}.items():
            try:
                client.chat.completions.create(model="m", messages=msg, max_tokens=2, **kw)
            except openai.BadRequestError as err:
                out[name] = (err.param, str(err))
        try:
            client.responses.create(model="m", input="hi", max_output_tokens=2, top_logprobs=2)
        except openai.BadRequestError as err:
            out["responses"] = err.param
        try:
            client.completions.create(model="m", prompt="2 + 2 =", max_tokens=2, logprobs=2)
        except openai.BadRequestError as err:
            out["completions"] = err.param
        c = client.completions.create(model="m", prompt="2 + 2 =", max_tokens=3, logprobs=0)
        out["completion_logprobs"] = len(c.choices[0].logprobs.token_logprobs)

    serve_while(flow, eng, calls)
    param, why = out["top"]
    assert param == "top_logprobs" and "returns the sampled token's logprob alone" in why
    param, why = out["no_logprobs"]
    assert param == "top_logprobs" and "needs logprobs: true" in why
    assert out["responses"] == "top_logprobs" and out["completions"] == "logprobs"
    assert out["completion_logprobs"] == 3


def test_a_chain_of_streamed_responses_is_one_token_exact_trajectory(setup):
    """responses.create, responses.stream and create(stream=True), each continuing the last by
    previous_response_id: the SDK parses every stream, and the three calls are one trajectory
    holding every engine sequence with its ids, logprobs and versions."""
    eng, make = setup
    flow = make("responses_chain")
    flow.start(item(0))
    [g], seen = drive(flow, eng, 1)
    assert not g.failed and g.counters["agent_calls"] == 6 and g.counters["agent_splits"] == 0
    assert len(g.samples) == 2 and len(seen) == 6  # one trajectory per episode
    for seq in seen:
        assert any(holds(s, seq) for s in g.samples), f"{seq.rid} is not recorded as generated"
    for _, (first, second, third), kinds, raw in ANSWERED:
        assert second.previous_response_id == first.id and third.previous_response_id == second.id
        for r in (first, second, third):
            assert r.status == "completed" and r.output[0].content[0].logprobs is not None
        expected = ["response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added", "response.output_text.delta",
                    "response.output_text.done", "response.content_part.done",
                    "response.output_item.done", "response.completed"]
        assert raw == expected and [k for k in kinds if k in expected] == expected


def test_an_unknown_previous_response_id_is_answered_404_as_openai_does(setup):
    eng, make = setup
    flow = make("responses_unknown_previous")
    flow.start(item(0, size=2))
    [g], _ = drive(flow, eng, 1)
    assert not g.failed
    (_, kept_a, answers_a), (_, kept_b, answers_b) = ANSWERED
    refused = (404, "previous_response_not_found", "previous_response_id")
    assert answers_a == answers_b == [refused, refused] and kept_a != kept_b


def test_the_stream_of_a_function_call_parses_in_the_openai_sdk():
    """A reply that calls a tool, streamed: the SDK's own stream state rebuilds the function call
    (output_item.added, function_call_arguments.delta and .done, output_item.done)."""
    from openai.lib.streaming.responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    from areal_cli.workflows.agent import responses as rs

    req = rs.responses_request({"input": "What is 3 + 4?", "tools": [
        {"type": "function", "name": "calculate", "parameters": {"type": "object"}}]})
    message = {"role": "assistant", "content": "Let me compute.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "calculate", "arguments": '{"expression": "3 + 4"}'}}]}
    resp = rs.response("tiny", message, (12, 9), req, None)
    state, adapter = ResponseStreamState(input_tools=req.raw_tools, text_format=openai.omit), \
        TypeAdapter(ResponseStreamEvent)
    kinds = []
    for chunk in rs.sse(resp):
        event = adapter.validate_json(chunk.split("data: ", 1)[1])
        kinds.append(event.type)
        state.handle_event(event)
    final = state._completed_response
    assert [o.type for o in final.output] == ["message", "function_call"]
    call = final.output[1]
    assert (call.name, call.arguments, call.call_id) == ("calculate", '{"expression": "3 + 4"}',
                                                          "call_1")
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"

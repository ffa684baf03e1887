"""Tool-call formats and chat templates of workflow=agent: a tool call as a template writes it
parses back to the same call, malformed ones are counted, and an episode's prompts built
incrementally (earlier ids kept, only what is new tokenised) equal the whole conversation's
rendering — or, where a template renders earlier turns differently later, the split is counted.

Templates: the default model's (it renders no tools: areal writes them in the Hermes format), and
Qwen2.5-Instruct's and Llama-3.2-Instruct's chat templates (tests/data/chat_templates) on the
default model's byte-level BPE with each model's special tokens added: their vocabularies cannot be
fetched here, and what is tested — where the template's text and the tokens meet — is the
template's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_cli.config.choices import ToolFormat
from areal_cli.model_source import resolve_model
from areal_cli.workflows.agent.chat import ChatRenderer, Reply, normalise
from areal_cli.workflows.agent.episode import Choice, EpisodeLog
from areal_cli.workflows.agent.toolcalls import ToolStyle, call_text, detect, parse

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "chat_templates"
TOOLS = [{"type": "function", "function": {
    "name": "calculate", "description": "Evaluate arithmetic.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "calculate", "arguments": '{"expression": "12 * 7"}'}}


def _tokenizer(kind: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    if kind == "qwen2.5":
        tok.chat_template = (TEMPLATES / "qwen2.5-instruct.jinja").read_text()
    elif kind == "llama3":
        tok.add_special_tokens({"additional_special_tokens": [
            "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<|python_tag|>"]})
        tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
        tok.chat_template = (TEMPLATES / "llama-3.2-instruct.jinja").read_text()
    return tok


@pytest.mark.parametrize("kind, fmt, native", [("smollm2", ToolFormat.hermes, False),
                                                ("qwen2.5", ToolFormat.hermes, True),
                                                ("llama3", ToolFormat.llama3_json, True)])
def test_the_tool_format_is_chosen_from_the_template(kind, fmt, native):
    style = detect(_tokenizer(kind))
    assert (style.format, style.native) == (fmt, native)


def _model_turn(r: ChatRenderer, before: list[dict], message: dict, tools) -> tuple[str, list[int]]:
    """What a model writes for ``message`` after ``before``, as the template renders it: the text
    between the generation prompt and the end-of-turn token (included), and its ids."""
    prompt = r.text(before, tools, generation=True)
    whole = r.text(before + [message], tools, generation=False)
    assert whole.startswith(prompt), "the template renders the generation prompt as a prefix"
    turn = whole[len(prompt):]
    turn = turn[: turn.index(r.eos_text) + len(r.eos_text)]
    return turn, r.encode(turn)


def _choice(ids: list[int]) -> Choice:
    return Choice(ids, [-0.5] * len(ids), [0] * len(ids), "stop")


@pytest.mark.parametrize("kind, same_ids",
                         [("smollm2", True), ("qwen2.5", True), ("llama3", False)])
def test_a_tool_conversation_built_call_by_call_equals_its_whole_rendering(kind, same_ids):
    # llama3: its generation prompt ends in "\n\n", which this BPE (not Llama's own) writes as one
    # token at the end of a text and as two before "{": the ids the model saw differ from a
    # re-tokenisation of the whole text at that boundary — what is kept is what the model saw, the
    # text is the same
    tok = _tokenizer(kind)
    r = ChatRenderer(tok, detect(tok))
    log = EpisodeLog("e", 8)
    msgs = normalise([{"role": "system", "content": "Use the tool."},
                      {"role": "user", "content": "What is 12 * 7?"}])
    asked = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    answered = {"role": "assistant", "content": "12 * 7 is 84."}

    p1 = r.prompt(msgs, TOOLS, [])
    assert p1.extends is None and p1.ids == r.encode(r.text(msgs, TOOLS, generation=True))
    text1, out1 = _model_turn(r, msgs, normalise([asked])[0], TOOLS)
    parsed = parse(r.style, tok.decode(out1, skip_special_tokens=True))
    assert not parsed.error and [c["function"]["name"] for c in parsed.tool_calls] == ["calculate"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"expression": "12 * 7"}
    log.record(p1.ids, [_choice(out1)])
    reply1 = Reply(msgs + normalise([asked]), p1.ids + out1, ended=True)

    msgs2 = msgs + normalise([asked, {"role": "tool", "tool_call_id": "call_1", "content": "84"}])
    p2 = r.prompt(msgs2, TOOLS, [reply1])
    assert p2.extends is reply1
    whole = r.text(msgs2, TOOLS, generation=True)
    assert tok.decode(p2.ids) == whole, "incremental text = whole rendering"
    assert (p2.ids == r.encode(whole)) == same_ids, "incremental ids = whole rendering, tokenised"
    _, out2 = _model_turn(r, msgs2, normalise([answered])[0], TOOLS)
    log.record(p2.ids, [_choice(out2)])

    assert log.splits == 0 and len(log.trajectories) == 1
    t = log.trajectories[0]
    assert t.ids() == p2.ids + out2
    env = p2.ids[len(p1.ids) + len(out1):]
    assert t.loss_mask == [1] * len(out1) + [0] * len(env) + [1] * len(out2)
    assert t.versions == [0] * len(out1) + [-1] * len(env) + [0] * len(out2)


def test_a_template_that_rewrites_earlier_turns_splits_the_episode_and_counts_it():
    tok = _tokenizer("smollm2")
    # renders an earlier assistant turn without its <think> part once later turns follow
    tok.chat_template = (
        "{%- for m in messages %}{%- set c = m['content'] %}{%- if m['role'] == 'assistant' and "
        "not loop.last %}{%- set c = c.split('</think>')[-1] %}{%- endif %}{{- '<|im_start|>' + "
        "m['role'] + '\\n' + c + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- "
        "'<|im_start|>assistant\\n' }}{%- endif %}")
    r = ChatRenderer(tok, ToolStyle(ToolFormat.hermes, False))
    log = EpisodeLog("e", 8)
    msgs = normalise([{"role": "user", "content": "2 + 2?"}])
    p1 = r.prompt(msgs, None, [])
    out1 = r.encode("<think>add</think>4<|im_end|>")
    log.record(p1.ids, [_choice(out1)])
    reply = Reply(msgs + normalise([{"role": "assistant", "content": "<think>add</think>4"}]),
                  p1.ids + out1, True)
    p2 = r.prompt(reply.messages + normalise([{"role": "user", "content": "Sure?"}]), None, [reply])
    assert p2.extends is None
    log.record(p2.ids, [_choice(r.encode("Yes<|im_end|>"))])
    assert log.splits == 1 and len(log.trajectories) == 2


@pytest.mark.parametrize("fmt", [ToolFormat.hermes, ToolFormat.llama3_json])
def test_a_written_tool_call_parses_back_to_the_same_call(fmt):
    style = ToolStyle(fmt, True)
    calls = [CALL] if fmt == ToolFormat.llama3_json else [CALL, {**CALL, "function": {
        "name": "lookup", "arguments": '{"key": "a;b", "n": [1, 2]}'}}]
    parsed = parse(style, call_text(style, calls))
    assert not parsed.error and parsed.content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in parsed.tool_calls] == \
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in parsed.tool_calls)


@pytest.mark.parametrize("fmt, text", [
    # not closed
    (ToolFormat.hermes, '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+1"}'),
    (ToolFormat.hermes, "<tool_call>\nnot json\n</tool_call>"),
    (ToolFormat.hermes, '<tool_call>\n{"arguments": {}}\n</tool_call>'),  # no name
    (ToolFormat.hermes, '<tool_call>\n{"name": "f", "arguments": {}} and more\n</tool_call>'),
    (ToolFormat.llama3_json, '{"name": "calculate", "parameters": '),
    (ToolFormat.llama3_json, '{"parameters": {"x": 1}}'),
])
def test_a_malformed_tool_call_is_plain_content_with_an_error(fmt, text):
    parsed = parse(ToolStyle(fmt, True), text)
    assert parsed.error and parsed.content == text and parsed.tool_calls == []


def test_a_call_whose_string_holds_the_closing_tag_is_read_as_json():
    """A sampled argument may hold "</tool_call>" (the grammar allows any string there): the call
    is its JSON object, not the text up to the first closing tag."""
    text = ('Let me.\n<tool_call>\n{"name": "f", "arguments": {"s": "a</tool_call>b"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')
    parsed = parse(ToolStyle(ToolFormat.hermes, False), text)
    assert not parsed.error and parsed.content == "Let me."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in parsed.tool_calls] == [("f", {"s": "a</tool_call>b"}), ("g", {})]


def test_text_without_a_call_is_content():
    assert parse(ToolStyle(ToolFormat.hermes, False),
                 "The answer is 4.").content == "The answer is 4."
    assert parse(ToolStyle(ToolFormat.llama3_json, True), "4").tool_calls == []


def test_tool_choice_names_a_function_in_either_api_shape_and_only_an_offered_one():
    from areal_cli.workflows.agent import requests as rq
    tools = rq.function_tools([{"type": "function", "function": {"name": "calculate"}}])
    assert rq.tool_choice(None, tools) == ("auto", None)
    assert rq.tool_choice("none", tools) == ("none", None)
    assert rq.tool_choice({"type": "function", "function": {"name": "calculate"}},
                          tools) == ("required", "calculate")
    assert rq.tool_choice({"type": "function", "name": "calculate"}, tools) == ("required",
                                                                                "calculate")
    for bad in ({"type": "function", "function": {"name": "search"}}, "sometimes",
                {"type": "file_search"}):
        with pytest.raises(rq.ApiError) as err:
            rq.tool_choice(bad, tools)
        assert err.value.status == 400 and "tool_choice" in str(err.value.body())
    with pytest.raises(rq.ApiError):
        rq.tool_choice("required", None)  # nothing to call
    body = {"input": "2 + 2?",
            "tools": [{"type": "function", "name": "calculate", "parameters": {}}],
            "tool_choice": {"type": "function", "name": "calculate"}}
    from areal_cli.workflows.agent import responses as rs

    assert rq.chat_request(rs.responses_request(body).as_chat([])).tool_name == "calculate"

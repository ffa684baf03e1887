"""What a request constrains its reply to, as the grammar both engines enforce token by token.

- ``tool_choice`` "required" (Anthropic: ``any``) or a named function (``tool``): exactly one call
  in the model's own format (Hermes: ``<tool_call>``, newline, ``{"name": ..., "arguments":
  {...}}``, newline, ``</tool_call>``; llama3_json: ``{"name": ..., "parameters": {...}}``), the
  name one of the offered tools' (or the named one), the arguments an object of that tool's JSON
  schema;
- ``response_format`` / the Responses API's ``text.format`` (``json_schema``, ``json_object``): the
  reply is JSON of that schema (any object for json_object); with tools offered and tool_choice
  "auto" the reply is either that JSON or a call.

The grammar is Lark text in llguidance's dialect (a ``%json`` rule holds a JSON schema): the hf
engine compiles it with llguidance, vLLM with its own llguidance backend. JSON is written compactly
with ``json.dumps``' separators (``", "``, ``": "``), as the tool calls the endpoint renders back
are, and objects that do not say otherwise take no properties beyond those they list (OpenAI's
strict mode). A schema llguidance cannot compile is answered 400 naming the field.
"""

from __future__ import annotations

import copy
import json

from areal_cli.config.choices import ToolFormat
from areal_cli.workflows.agent.requests import ApiError, ChatRequest
from areal_cli.workflows.agent.toolcalls import ToolStyle

CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
# how the JSON is written: json.dumps' default separators, no other whitespace
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT = {"type": "object"}
_NESTED = ("items", "additionalItems", "not", "if", "then", "else", "contains")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed(schema: dict) -> dict:
    """A copy of ``schema`` in which every object schema that lists properties and says nothing of
    others takes none (``additionalProperties: false``)."""
    out = copy.deepcopy(schema)
    todo = [out]
    while todo:
        s = todo.pop()
        if not isinstance(s, dict):
            continue
        if isinstance(s.get("properties"), dict) and "additionalProperties" not in s:
            s["additionalProperties"] = False
        todo += [s[k] for k in _NESTED if isinstance(s.get(k), dict)]
        todo += [x for k in _LISTS if isinstance(s.get(k), list) for x in s[k]]
        todo += [x for k in _MAPS if isinstance(s.get(k), dict) for x in s[k].values()]
        if isinstance(s.get("additionalProperties"), dict):
            todo.append(s["additionalProperties"])
    return out


def _json_rule(schema: dict) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": LAYOUT}, ensure_ascii=False)


def json_grammar(schema: dict) -> str:
    """The grammar of a reply that is JSON of ``schema`` (its objects closed)."""
    return f"start: {_json_rule(closed(schema))}"


def call_schema(style: ToolStyle, tools: list[dict], name: str | None) -> dict:
    """The JSON schema of one call of ``tools`` (only ``name`` when given) in ``style``'s keys."""
    key = "parameters" if style.format == ToolFormat.llama3_json else "arguments"
    shapes = []
    for t in tools:
        fn = t["function"]
        if name is not None and fn["name"] != name:
            continue
        params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else ANY_OBJECT
        shapes.append({"type": "object", "required": ["name", key], "additionalProperties": False,
                       "properties": {"name": {"const": fn["name"]}, key: closed(params)}})
    return shapes[0] if len(shapes) == 1 else {"anyOf": shapes}


def call_rule(style: ToolStyle, tools: list[dict], name: str | None) -> str:
    """The Lark expansion of one call in ``style``."""
    body = _json_rule(call_schema(style, tools, name))
    if style.format == ToolFormat.llama3_json:
        return body
    return f"{json.dumps(CALL_OPEN)} {body} {json.dumps(CALL_CLOSE)}"


def reply_grammar(style: ToolStyle, req: ChatRequest) -> str:
    """The grammar ``req`` holds its reply to ("" = none), checked to compile."""
    call = req.tools and req.tool_choice == "required"
    if not call and req.response_schema is None:
        return ""
    try:
        return _grammar(style, req, call)
    except RecursionError as err:  # copying or writing a schema nested past Python's stack
        raise ApiError(400, "a JSON schema of this request is nested too deep to enforce",
                       "invalid_request_error", None,
                       "tools" if call else "response_format") from err


def _grammar(style: ToolStyle, req: ChatRequest, call: bool) -> str:
    if call:
        grammar, param = f"start: {call_rule(style, req.tools, req.tool_name)}", "tools"
    else:
        grammar, param = json_grammar(req.response_schema), "response_format"
        if req.tools and req.tool_choice == "auto":  # the JSON, or a call
            grammar = (f"start: reply | call\nreply: {_json_rule(closed(req.response_schema))}\n"
                       f"call: {call_rule(style, req.tools, None)}")
    check(grammar, param)
    return grammar


def check(grammar: str, param: str) -> None:
    """400 naming ``param`` when llguidance cannot compile ``grammar`` (a schema it does not
    support, or not a JSON schema at all)."""
    try:
        import llguidance
    except ImportError as err:
        raise ApiError(400, "constrained decoding (tool_choice required, response_format) needs "
                       "llguidance on the rollout worker: pip install 'areal-cli[agents]'",
                       "invalid_request_error", None, param) from err
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ApiError(400, f"the JSON schema of {param} cannot be enforced: {error[:500]}",
                       "invalid_request_error", None, param)

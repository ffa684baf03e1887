"""Tool calls in the model's own words: which format a chat template speaks, how tool schemas reach
the prompt, and how a completion's text becomes OpenAI ``tool_calls``.

Two formats:
- ``hermes`` (Qwen2.5, Hermes, and the default for templates that render no tools):
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call;
- ``llama3_json`` (Llama 3.1+): the whole reply is ``{"name": ..., "parameters": {...}}``,
  optionally after ``<|python_tag|>``, several calls separated by ``;``.

A template that renders no tools (the default SmolLM2's) gets the schemas in its system message,
written in the Hermes format, and its assistant tool calls and tool results are written as Hermes
text too, so every request of an episode renders the same way. A reply that starts a call but does
not finish one well-formed is returned as plain content (finish_reason "stop") and counted; a call
that tool_choice requires is decoded under a grammar of this format (constraints.py).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from areal_cli.config.choices import ToolFormat

PROBE = "areal_probe_tool"


@dataclass
class Parsed:
    """A completion's text split into what the agent reads."""

    content: str | None  # text outside the calls (None when there is none)
    # OpenAI shape: {id, type, function: {name, arguments}}
    tool_calls: list[dict] = field(default_factory=list)
    error: str = ""  # why a started call was not parsed ("" if none was malformed)


@dataclass(frozen=True)
class ToolStyle:
    """A tokenizer's tool-call format and whether its template renders tool schemas itself."""

    format: ToolFormat
    native: bool  # False: areal writes the schemas into the system message (Hermes text)

    def describe(self) -> str:
        where = "rendered by the chat template" if self.native else ("written into the system "
                                                                     "message by areal")
        return f"tool calls in the {self.format.value} format, tool schemas {where}"


def detect(tokenizer, wanted: ToolFormat = ToolFormat.template) -> ToolStyle:
    """The tool style of ``tokenizer``'s chat template: native when rendering a probe tool shows its
    name; the format from what the template writes (``<tool_call>`` → hermes, ``<|python_tag|>`` or
    a "parameters" object → llama3_json), or ``wanted`` when it is not "template"."""
    probe = {"type": "function", "function": {"name": PROBE, "description": "probe",
                                              "parameters": {"type": "object", "properties": {}}}}
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[probe],
                                             tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 — a template that fails on tools renders none
        text = ""
    native = PROBE in text
    source = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else json.dumps(
        tokenizer.chat_template or "")
    if wanted != ToolFormat.template:
        return ToolStyle(wanted, native)
    if native and "<tool_call>" not in source and ("<|python_tag|>" in source
                                                   or '"parameters"' in source):
        return ToolStyle(ToolFormat.llama3_json, True)
    return ToolStyle(ToolFormat.hermes, native)


def tools_system_text(tools: list[dict]) -> str:
    """The system-message text that offers ``tools`` (OpenAI function tools) in the Hermes
    format."""
    lines = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return ("You can call functions to help with the user's request. Their signatures, as JSON, "
            "are "
            f"inside <tools></tools>:\n<tools>\n{lines}\n</tools>\n\nTo call a function, write its "
            "name "
            "and arguments as a JSON object inside <tool_call></tool_call> tags:\n<tool_call>\n"
            '{"name": "<function name>", "arguments": {<arguments>}}\n</tool_call>')


def call_text(style: ToolStyle, calls: list[dict]) -> str:
    """The text a model of ``style`` writes for ``calls`` (OpenAI shape), for rendering them
    back."""
    objs = [{"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
            for c in calls]
    if style.format == ToolFormat.llama3_json:
        return "; ".join(json.dumps({"name": o["name"], "parameters": o["arguments"]})
                         for o in objs)
    return "\n".join(f"<tool_call>\n{json.dumps(o, ensure_ascii=False)}\n</tool_call>"
                     for o in objs)


def arguments_value(raw):
    """A call's arguments as sent (a JSON text, or already an object) → the decoded value; text that
    is not JSON stays as it is."""
    if isinstance(raw, dict):
        return raw
    try:
        return json.loads(raw or "{}")
    except (TypeError, ValueError):
        return raw


def _arguments(raw) -> dict:
    """The arguments object to write back into a call: the decoded object, else the value
    wrapped."""
    value = arguments_value(raw)
    if isinstance(value, dict):
        return value
    # not JSON / JSON but not an object
    return {"_raw": str(raw)} if value is raw else {"_value": value}


def parse(style: ToolStyle, text: str) -> Parsed:
    """``text`` (a completion, special tokens removed) as content and tool calls."""
    if style.format == ToolFormat.llama3_json:
        return _parse_llama3(text)
    return _parse_hermes(text)


def _call(name, arguments) -> dict | None:
    if not isinstance(name, str) or not name or not isinstance(arguments, (dict, str)):
        return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _parse_hermes(text: str) -> Parsed:
    """Each ``<tool_call>`` holds one JSON object and then ``</tool_call>``: the object is read as
    JSON (a string in it may hold ``</tool_call>``), not cut at the first closing tag."""
    if "<tool_call>" not in text:
        return Parsed(text)
    calls, at, decoder = [], text.index("<tool_call>"), json.JSONDecoder()
    while at >= 0:
        start = at + len("<tool_call>")
        start += len(text[start:]) - len(text[start:].lstrip())
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError as err:
            return Parsed(text, error=f"a <tool_call> that is not JSON ({err})")
        call = _call(obj.get("name"), obj.get("arguments", {})) if isinstance(obj, dict) else None
        if call is None:
            return Parsed(text, error="a <tool_call> without a name and an arguments object")
        if not text[end:].lstrip().startswith("</tool_call>"):
            return Parsed(text, error="a <tool_call> that is not closed")
        calls.append(call)
        close = text.index("</tool_call>", end) + len("</tool_call>")
        at = text.find("<tool_call>", close)
    content = text[: text.index("<tool_call>")].strip()
    return Parsed(content or None, calls)


def _parse_llama3(text: str) -> Parsed:
    body = text.replace("<|python_tag|>", "").strip()
    if not body.startswith("{"):
        return Parsed(text)
    calls = []
    for part in _split_objects(body):
        try:
            obj = json.loads(part)
        except ValueError as err:
            return Parsed(text, error=f"a tool call that is not JSON ({err})")
        call = _call(obj.get("name"),
                     obj.get("parameters", obj.get("arguments"))) if isinstance(obj, dict) else None
        if call is None:
            return Parsed(text, error='a tool call without "name" and a "parameters" object')
        calls.append(call)
    return Parsed(None, calls)


def _split_objects(body: str) -> list[str]:
    """``{...}; {...}`` → the objects' texts (split at top-level ``;`` outside strings)."""
    parts, depth, start, quoted, escaped = [], 0, 0, False, False
    for i, ch in enumerate(body):
        if quoted:
            escaped, quoted = (not escaped and ch == "\\"), quoted and (escaped or ch != '"')
            continue
        if ch == '"':
            quoted = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == ";" and depth == 0:
            parts.append(body[start:i].strip())
            start = i + 1
    parts.append(body[start:].strip())
    return [p for p in parts if p]

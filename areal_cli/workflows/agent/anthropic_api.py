"""Anthropic's Messages API (``POST /v1/messages``) on the agent endpoint: a body checked and turned
into the chat request the endpoint serves, the chat reply as an Anthropic ``Message``, its
server-sent events, and errors in Anthropic's shape.

The conversion, so that a conversation is rendered, recorded and parsed exactly as the same one sent
to /v1/chat/completions:
- ``system`` (a string or text blocks) → the system message;
- a user message's text blocks → a user message; each ``tool_result`` → a tool message (its text,
  after ``Error: `` when ``is_error``);
- an assistant message's text blocks → its content, its ``tool_use`` blocks → its tool calls (the
  ``input`` object as the arguments);
- ``tools`` (``name``, ``description``, ``input_schema``) → function tools; ``tool_choice`` auto /
  any / tool (a name) / none → auto / required / the named function / none;
- ``max_tokens`` (required), ``stop_sequences`` → the chat request's budget and stop strings;
  ``temperature``, ``top_p``, ``top_k``, ``metadata`` are accepted and not applied (the run's
  sampling is what the trainer recomputes), like every field the endpoint does not read.
A tool_result must answer a tool_use of the assistant message just before it, and every tool_use
must be answered there (as Anthropic's API requires); the last message must be the user's.
"""

from __future__ import annotations

import json
import uuid

from areal_cli.workflows.agent.chat import normalise
from areal_cli.workflows.agent.requests import ApiError, ChatRequest, tool_choice

MAX_STOP = 16  # stop_sequences of one request
# HTTP status → Anthropic's error type
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, "invalid_request_error", None, param)


def messages_request(body, counting: bool = False) -> ChatRequest:
    """A Messages API body as the chat request it asks for (``counting``: a count_tokens body,
    which needs no max_tokens)."""
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object", "body")
    if counting and body.get("stream"):
        raise _bad("count_tokens does not stream", "stream")
    tools = _tools(body.get("tools"))
    choice, name = _tool_choice(body.get("tool_choice"), tools)
    system = body.get("system")
    msgs = [] if system is None else [{"role": "system",
                                       "content": _text(system, "system")}]
    return ChatRequest(normalise(msgs + _messages(body.get("messages"))), tools, choice,
                       None if counting else _max_tokens(body.get("max_tokens")), 1,
                       _stop(body.get("stop_sequences")), name)


def _max_tokens(v) -> int:
    if v is None:
        raise _bad("max_tokens is required: the most tokens the reply may have", "max_tokens")
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 1 << 20:
        raise _bad("max_tokens must be an integer in 1..1048576", "max_tokens")
    return v


def _stop(v) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > MAX_STOP or not all(isinstance(s, str) and s
                                                               for s in v):
        raise _bad(f"stop_sequences must be a list of up to {MAX_STOP} non-empty strings",
                   "stop_sequences")
    return v


def _text(v, param: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                   and isinstance(b.get("text"), str) for b in v):
        return "".join(b["text"] for b in v)
    raise _bad("must be a string or a list of text blocks ({type: text, text})", param)


def _tools(raw) -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise _bad("tools must be a list of {name, description?, input_schema}", "tools")
    out, names = [], set()
    for j, t in enumerate(raw):
        p = f"tools[{j}]"
        if not isinstance(t, dict):
            raise _bad("each tool must be {name, description?, input_schema}", p)
        if t.get("type") not in (None, "custom"):
            raise _bad(f"tools of type {t['type']!r} (Anthropic's server tools) are not served "
                       "here: give client tools as {name, description?, input_schema}", f"{p}.type")
        name, schema, about = t.get("name"), t.get("input_schema"), t.get("description")
        if not isinstance(name, str) or not name or name in names:
            raise _bad("each tool needs a name of its own (a non-empty string)", f"{p}.name")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise _bad('input_schema must be a JSON schema object ({"type": "object", ...})',
                       f"{p}.input_schema")
        if about is not None and not isinstance(about, str):
            raise _bad("description must be a string", f"{p}.description")
        names.add(name)
        fn = {"name": name, **({"description": about} if about else {}), "parameters": schema}
        out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(raw, tools: list[dict] | None) -> tuple[str, str | None]:
    if raw is None:
        return "auto", None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if isinstance(kind, str) and kind in TOOL_CHOICES:
        return tool_choice(TOOL_CHOICES[kind], tools)
    if kind == "tool" and isinstance(raw.get("name"), str):
        return tool_choice({"type": "function", "function": {"name": raw["name"]}}, tools)
    raise _bad("tool_choice must be {type: auto}, {type: any}, {type: none} or {type: tool, name}",
               "tool_choice")


def _messages(raw) -> list[dict]:
    """The conversation as chat messages (see the module's docstring)."""
    if not isinstance(raw, list) or not raw:
        raise _bad("messages must be a non-empty list", "messages")
    out, asked, seen = [], {}, set()  # asked: the tool_use ids of the last assistant message
    for i, m in enumerate(raw):
        p = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise _bad("each message needs role user or assistant (the system prompt is the "
                       "system field)", p)
        blocks = m.get("content")
        blocks = [{"type": "text", "text": blocks}] if isinstance(blocks, str) else blocks
        if not isinstance(blocks, list) or not blocks or not all(isinstance(b, dict)
                                                                 for b in blocks):
            raise _bad("content must be a string or a non-empty list of content blocks",
                       f"{p}.content")
        if asked and m["role"] != "user":
            raise _bad(f"tool_use ids {sorted(asked)} have no tool_result in the message after "
                       "theirs", p)
        if m["role"] == "assistant":
            message, asked = _assistant(blocks, p, seen)
            out.append(message)
        else:
            out += _user(blocks, p, asked)
            asked = {}
    if raw[-1]["role"] != "user":
        raise _bad("the last message must be the user's (continuing a prefilled assistant reply "
                   "is not supported)", f"messages[{len(raw) - 1}]")
    return out


def _assistant(blocks: list[dict], p: str, seen: set) -> tuple[dict, dict]:
    """An assistant message and its tool_use ids (ids must be unique across the request)."""
    text, calls, ids = [], [], {}
    for j, b in enumerate(blocks):
        q = f"{p}.content[{j}]"
        if b.get("type") == "text":
            text.append(_block_text(b, q))
        elif b.get("type") == "tool_use":
            cid, name, args = b.get("id"), b.get("name"), b.get("input")
            if not isinstance(cid, str) or not cid or cid in seen:
                raise _bad("a tool_use needs an id of its own (a non-empty string)", f"{q}.id")
            if not isinstance(name, str) or not name:
                raise _bad("a tool_use needs the tool's name", f"{q}.name")
            if not isinstance(args, dict):
                raise _bad("a tool_use's input must be a JSON object", f"{q}.input")
            seen.add(cid)
            ids[cid] = q
            calls.append({"id": cid, "type": "function",
                          "function": {"name": name, "arguments": args}})
        else:
            raise _bad(f"an assistant message holds text and tool_use blocks, not "
                       f"{_kind(b)}", q)
    message = {"role": "assistant", "content": "".join(text)}
    return ({**message, "tool_calls": calls} if calls else message), ids


def _user(blocks: list[dict], p: str, asked: dict) -> list[dict]:
    """A user message's blocks as chat messages: its text, and a tool message per tool_result,
    each answering one of ``asked``."""
    out, answered = [], set()
    for j, b in enumerate(blocks):
        q = f"{p}.content[{j}]"
        if b.get("type") == "text":
            if out and out[-1]["role"] == "user":
                out[-1]["content"] += _block_text(b, q)
            else:
                out.append({"role": "user", "content": _block_text(b, q)})
        elif b.get("type") == "tool_result":
            cid = b.get("tool_use_id")
            if not isinstance(cid, str) or cid not in asked or cid in answered:
                raise _bad(f"tool_use_id {cid!r} answers no tool_use of the assistant message "
                           f"before it (its ids: {sorted(asked)}), or answers one twice",
                           f"{q}.tool_use_id")
            answered.add(cid)
            content = b.get("content")
            text = "" if content is None else _text(content, f"{q}.content")
            error = b.get("is_error")
            if error is not None and not isinstance(error, bool):
                raise _bad("is_error must be true or false", f"{q}.is_error")
            out.append({"role": "tool", "tool_call_id": cid,
                        "content": f"Error: {text}" if error else text})
        else:
            raise _bad(f"a user message holds text and tool_result blocks, not {_kind(b)}", q)
    missing = sorted(set(asked) - answered)
    if missing:
        raise _bad(f"tool_use ids {missing} have no tool_result in this message", p)
    return out


def _block_text(block: dict, q: str) -> str:
    if not isinstance(block.get("text"), str):
        raise _bad("a text block's text must be a string", f"{q}.text")
    return block["text"]


def _kind(block: dict) -> str:
    kind = block.get("type")
    return f"a {kind!r} block" if isinstance(kind, str) else "a block without a type"


# ---- the reply ----

def message(model: str, chat_message: dict, reason: str, stop_sequence: str | None,
            input_tokens: int, output_tokens: int) -> dict:
    """A chat reply (OpenAI's assistant message and finish reason) as an Anthropic ``Message``:
    its text and a tool_use block per tool call."""
    from anthropic.types import Message

    content = [{"type": "text", "text": chat_message["content"]}] if chat_message.get(
        "content") else []
    for c in chat_message.get("tool_calls", []):
        content.append({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}",
                        "name": c["function"]["name"],
                        "input": json.loads(c["function"]["arguments"])})
    stop = {"tool_calls": "tool_use", "length": "max_tokens"}.get(reason) or (
        "stop_sequence" if stop_sequence else "end_turn")
    out = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
           "model": model, "content": content, "stop_reason": stop,
           "stop_sequence": stop_sequence,
           "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}
    Message.model_validate(out)  # the shape the anthropic client reads
    return out


def sse(msg: dict):
    """A finished ``Message`` as the events of Anthropic's stream: message_start, per content block
    its start, one delta (text_delta, or input_json_delta for a tool_use) and its stop,
    message_delta (stop_reason, usage), message_stop."""
    def event(kind: str, **data) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

    usage = msg["usage"]
    yield event("message_start", message={**msg, "content": [], "stop_reason": None,
                                          "stop_sequence": None,
                                          "usage": {**usage, "output_tokens": 0}})
    for i, block in enumerate(msg["content"]):
        if block["type"] == "text":
            yield event("content_block_start", index=i, content_block={"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            yield event("content_block_start", index=i, content_block={**block, "input": {}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield event("content_block_delta", index=i, delta=delta)
        yield event("content_block_stop", index=i)
    yield event("message_delta", delta={"stop_reason": msg["stop_reason"],
                                        "stop_sequence": msg["stop_sequence"]},
                usage={"output_tokens": usage["output_tokens"]})
    yield event("message_stop")


def error_body(err: ApiError) -> dict:
    """An error in Anthropic's shape: its type from the HTTP status, the field in the message."""
    where = f"{err.param}: " if err.param else ""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(err.status, "api_error"),
                                       "message": where + err.message}}

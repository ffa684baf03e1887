"""The Responses API (``POST /v1/responses``) as the chat call it converts to: the body checked and
turned into chat messages, the reply built as a ``Response``, streamed as the API's events, and
the responses kept for ``previous_response_id``.

A request naming ``previous_response_id`` continues that response's conversation: its input items
and its output, kept as the normalised chat messages the call was served as (so the rebuilt prompt
starts with that call's exact ids, ``chat.ChatRenderer.prompt``), followed by this request's input.
As in OpenAI's API, the earlier ``instructions`` are not carried over: a chain keeps its prompt (and
its trajectory) only when every call sends the same instructions. Responses are kept per episode
(plain ``/v1`` calls: the last ``KEPT_UNATTRIBUTED``), unless the request says ``store: false``; an
unknown id is answered 404 ``previous_response_not_found``, as OpenAI answers it.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from areal_cli.workflows.agent.requests import (
    MAX_TOP,
    ROLES,
    ApiError,
    bad,
    body_dict,
    function_tools,
    opt_int,
    response_schema,
)

INCLUDE = "message.output_text.logprobs"  # the include that asks for the output text's logprobs
KEPT_UNATTRIBUTED = 256  # responses of plain /v1 calls (outside any episode) kept for chains


@dataclass
class ResponsesRequest:
    items: list[dict]  # the input items as chat messages (instructions not among them)
    tools: list[dict] | None
    max_tokens: int | None
    raw_tools: list = field(default_factory=list)
    tool_choice: object = "auto"  # as sent (checked when the chat request is built)
    instructions: str | None = None
    previous: str | None = None  # previous_response_id
    store: bool = True
    stream: bool = False
    top_logprobs: int = 0
    logprobs: bool = False  # include names message.output_text.logprobs (or top_logprobs > 0)
    text: dict | None = None  # the body's text field as sent (its format: text.format)

    def as_chat(self, history: list[dict]) -> dict:
        """The chat body of this request after ``history`` (the previous response's conversation,
        normalised)."""
        choice = self.tool_choice
        if isinstance(choice, dict) and isinstance(choice.get("name"), str):  # a named function
            choice = {"type": "function", "function": {"name": choice["name"]}}
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        schema = response_schema(self.text.get("format"), "text.format") if self.text else None
        return {"messages": system + history + self.items, "tools": self.tools,
                "max_tokens": self.max_tokens, "tool_choice": choice,
                "logprobs": self.logprobs, "top_logprobs": self.top_logprobs,
                "response_format": None if schema is None else {
                    "type": "json_schema", "json_schema": {"schema": schema}}}


def _items(raw) -> list[dict]:
    """Input items → chat messages: a function_call joins the assistant message before it, a
    function_call_output is a tool message; reasoning items are dropped."""
    raw = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    if not isinstance(raw, list) or not raw:
        raise bad("input must be a string or a non-empty list of items", "input")
    msgs: list[dict] = []
    for i, it in enumerate(raw):
        if not isinstance(it, dict):
            raise bad("each input item must be an object", f"input[{i}]")
        kind = it.get("type", "message")
        if kind == "message" and it.get("role") in ROLES:
            msgs.append({"role": it["role"], "content": it.get("content")})
        elif kind == "function_call" and isinstance(it.get("name"), str):
            call = {"id": str(it.get("call_id", "")), "type": "function",
                    "function": {"name": it["name"], "arguments": str(it.get("arguments", "{}"))}}
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out = it.get("output")
            msgs.append({"role": "tool", "tool_call_id": str(it.get("call_id", "")),
                         "content": out if isinstance(out, str) else json.dumps(out)})
        elif kind != "reasoning":
            raise bad(f"input items of type {kind!r} are not supported", f"input[{i}]")
    return msgs


def responses_request(body) -> ResponsesRequest:
    """A Responses API body, checked."""
    body = body_dict(body)
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise bad("tools must be a list", "tools")
    fns = [t for t in tools if isinstance(t, dict) and t.get("type") == "function"]
    if len(fns) != len(tools):
        raise bad("only function tools are supported on this endpoint", "tools")
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise bad("include must be a list of strings", "include")
    prev = body.get("previous_response_id")
    if prev is not None and not (isinstance(prev, str) and prev):
        raise bad("previous_response_id must be a response's id", "previous_response_id")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions must be a string", "instructions")
    top = opt_int(body, "top_logprobs", lo=0, hi=MAX_TOP) or 0
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise bad("text must be an object ({format: {type: text | json_object | json_schema}})",
                  "text")
    return ResponsesRequest(_items(body.get("input")),
                            function_tools([{"type": "function", "function": t} for t in fns]),
                            opt_int(body, "max_output_tokens"), fns,
                            body.get("tool_choice", "auto"), instructions or None, prev,
                            body.get("store") is not False, bool(body.get("stream")), top,
                            INCLUDE in include or top > 0, text)


class Kept:
    """Responses kept for ``previous_response_id``: id → the conversation it ends (normalised chat
    messages, instructions left out); ``cap``: at most that many, the oldest dropped first."""

    def __init__(self, cap: int | None = None):
        self.cap, self.items = cap, OrderedDict()

    def get(self, rid: str | None) -> list[dict]:
        if rid is None:
            return []
        conv = self.items.get(rid)
        if conv is None:
            raise ApiError(404, f"Previous response with id {rid!r} not found (responses are kept "
                           "per episode, unless a request says store: false)",
                           "invalid_request_error", "previous_response_not_found",
                           "previous_response_id")
        return conv

    def put(self, rid: str, conversation: list[dict]) -> None:
        self.items[rid] = conversation
        while self.cap is not None and len(self.items) > self.cap:
            self.items.popitem(last=False)


def conversation(messages: list[dict], req: ResponsesRequest) -> list[dict]:
    """What a served call's messages (its reply included) keep for a later call: all of them but
    the instructions' system message."""
    return messages[1:] if req.instructions else list(messages)


def response(model: str, message: dict, usage: tuple[int, int], req: ResponsesRequest,
             logprobs: list[dict] | None) -> dict:
    """A served call's assistant message as a ``Response`` (``logprobs``: its output text's, or
    None)."""
    from openai.types.responses import Response

    output = []
    if message.get("content"):
        part = {"type": "output_text", "text": message["content"], "annotations": []}
        if logprobs is not None:
            part["logprobs"] = logprobs
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant",
                       "status": "completed", "content": [part]})
    for c in message.get("tool_calls", []):
        args = c["function"]["arguments"]
        output.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}",
                       "call_id": c.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                       "name": c["function"]["name"],
                       "arguments": args if isinstance(args, str) else json.dumps(args),
                       "status": "completed"})
    prompt, completion = usage
    now = time.time()
    return Response.model_validate({
        "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": now,
        "completed_at": now, "model": model, "status": "completed", "output": output,
        "parallel_tool_calls": True, "tool_choice": req.tool_choice, "tools": req.raw_tools,
        "instructions": req.instructions, "previous_response_id": req.previous,
        "store": req.store, "top_logprobs": req.top_logprobs,
        "usage": {"input_tokens": prompt, "output_tokens": completion,
                  "total_tokens": prompt + completion,
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }).model_dump(mode="json", exclude_none=True)


def sse(resp: dict):
    """A finished ``Response`` as the Responses API's stream: response.created and .in_progress;
    per output item its output_item.added, then (a message) content_part.added, one
    output_text.delta (with its logprobs), output_text.done, content_part.done, or (a function
    call) one function_call_arguments.delta and .done; its output_item.done; response.completed."""
    numbers = itertools.count()

    def event(kind: str, **data) -> str:
        return (f"event: {kind}\ndata: "
                f"{json.dumps({'type': kind, 'sequence_number': next(numbers), **data})}\n\n")

    start = {**resp, "status": "in_progress", "output": [], "completed_at": None}
    start.pop("usage", None)
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    for i, item in enumerate(resp["output"]):
        at = {"item_id": item["id"], "output_index": i}
        if item["type"] == "message":
            yield event("response.output_item.added", output_index=i,
                        item={**item, "status": "in_progress", "content": []})
            for j, part in enumerate(item["content"]):
                lps = [{"token": e["token"], "logprob": e["logprob"],
                        "top_logprobs": [{"token": a["token"], "logprob": a["logprob"]}
                                         for a in e["top_logprobs"]]}
                       for e in part.get("logprobs", [])]
                yield event("response.content_part.added", **at, content_index=j,
                            part={**part, "text": "", "logprobs": []})
                yield event("response.output_text.delta", **at, content_index=j,
                            delta=part["text"], logprobs=lps)
                yield event("response.output_text.done", **at, content_index=j,
                            text=part["text"], logprobs=lps)
                yield event("response.content_part.done", **at, content_index=j, part=part)
        else:
            yield event("response.output_item.added", output_index=i,
                        item={**item, "status": "in_progress", "arguments": ""})
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **at, name=item["name"],
                        arguments=item["arguments"])
        yield event("response.output_item.done", output_index=i, item=item)
    yield event("response.completed", response=resp)

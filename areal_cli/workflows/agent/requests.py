"""Request bodies checked, and responses built with the ``openai`` package's own types.

A body is hostile until checked: each field the endpoint reads is taken with its type and range, and
anything wrong is an ``ApiError`` (400, OpenAI's error shape) naming the field. Fields the endpoint
does not use (temperature, top_p, seed, user, ...) are accepted and ignored.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 16
MAX_TOP = 20  # OpenAI's bound on chat's top_logprobs
MAX_COMPLETION_TOP = 5  # and on /v1/completions' logprobs


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.code, self.param = code, param

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.code, self.param)


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, "invalid_request_error", None, param)


def opt_int(body: dict, *names: str, lo: int = 1, hi: int = 1 << 20) -> int | None:
    for name in names:
        v = body.get(name)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise bad(f"{name} must be an integer in {lo}..{hi}", name)
        return v
    return None


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    v = [v] if isinstance(v, str) else v
    if not isinstance(v, list) or len(v) > 4 or not all(isinstance(s, str) and s for s in v):
        raise bad("stop must be a string or a list of up to 4 non-empty strings", "stop")
    return v


def function_tools(raw, param: str = "tools") -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad("tools must be a list of function tools", param)
    out = []
    for t in raw:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise bad("each tool must be {type: function, function: {name, description?, "
                       "parameters?}}", param)
        out.append({"type": "function",
                    "function": {k: fn[k] for k in ("name", "description", "parameters")
                                                      if k in fn}})
    return out or None


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if c is None or isinstance(c, str):
        return c or ""
    if isinstance(c, list) and all(isinstance(p, dict) and isinstance(p.get("text", ""), str)
                                   for p in c):
        if any(p.get("type") not in ("text", "input_text", "output_text") for p in c):
            raise bad("only text content parts are supported", f"messages[{i}].content")
        return "".join(p.get("text", "") for p in c)
    raise bad("content must be a string or a list of text parts", f"messages[{i}].content")


def _messages(raw) -> list[dict]:
    from areal_cli.workflows.agent.chat import normalise

    if not isinstance(raw, list) or not raw:
        raise bad("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad(f"each message needs a role in {', '.join(ROLES)}", f"messages[{i}]")
        n = {"role": "system" if m["role"] == "developer" else m["role"], "content": _content(m, i)}
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list) or not all(
                    isinstance(c, dict) and isinstance(c.get("function"), dict)
                    and isinstance(c["function"].get("name"), str) for c in calls):
                raise bad("tool_calls must be a list of {function: {name, arguments}}",
                           f"messages[{i}].tool_calls")
            n["tool_calls"] = calls
        for key in ("tool_call_id", "name"):
            if isinstance(m.get(key), str):
                n[key] = m[key]
        out.append(n)
    return normalise(out)


@dataclass
class ChatRequest:
    messages: list[dict]
    tools: list[dict] | None
    tool_choice: str  # auto | none | required (a named function: required, with tool_name)
    max_tokens: int | None
    n: int
    stop: list[str]
    tool_name: str | None = None  # tool_choice named this function: the reply must call it
    logprobs: bool = False  # return the sampled tokens' logprobs
    top_logprobs: int = 0  # and this many alternatives per token
    # response_format's JSON schema (json_object: any object); None = free text
    response_schema: dict | None = None


def body_dict(body) -> dict:
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object", "body")
    return body


def tool_choice(raw, tools: list[dict] | None) -> tuple[str, str | None]:
    """``tool_choice`` as (auto | none | required, the function it names or None). A named function
    is ``{"type": "function", "function": {"name": ...}}`` (chat) or ``{"type": "function", "name":
    ...}`` (Responses); it must be one of ``tools``, and required needs tools."""
    if raw is None:
        return "auto", None
    if isinstance(raw, str) and raw in ("auto", "none", "required"):
        choice, name = raw, None
    elif isinstance(raw, dict) and raw.get("type") == "function":
        fn = raw.get("function")
        name = fn.get("name") if isinstance(fn, dict) else raw.get("name")
        if not isinstance(name, str):
            raise bad("a named tool_choice is {type: function, function: {name}}", "tool_choice")
        choice = "required"
    else:
        raise bad("tool_choice must be auto, none, required or a named function", "tool_choice")
    names = [t["function"]["name"] for t in tools or []]
    if choice == "required" and not names:
        raise bad("tool_choice requires a tool call but the request offers no tools",
                   "tool_choice")
    if name is not None and name not in names:
        raise bad(f"tool_choice names {name!r}, which is not among the tools {names}",
                   "tool_choice")
    return choice, name


def response_schema(raw, param: str = "response_format") -> dict | None:
    """``response_format`` (chat: ``{type: json_schema, json_schema: {name, schema, strict}}``) or
    ``text.format`` (Responses: ``{type: json_schema, name, schema, strict}``) → the JSON schema the
    reply must follow; ``json_object`` → any object; ``text`` or none → None."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise bad(f"{param} must be {{type: text}}, {{type: json_object}} or {{type: "
                   "json_schema, ...}}", param)
    inner = raw.get("json_schema", raw)
    schema = inner.get("schema", {"type": "object"}) if isinstance(inner, dict) else None
    if not isinstance(schema, dict):
        raise bad(f"{param}'s schema must be a JSON schema (an object)", param)
    return schema


def chat_request(body) -> ChatRequest:
    body = body_dict(body)
    tools = function_tools(body.get("tools"))
    choice, name = tool_choice(body.get("tool_choice"), tools)
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad("logprobs must be true or false", "logprobs")
    top = opt_int(body, "top_logprobs", lo=0, hi=MAX_TOP) or 0
    if top and not logprobs:
        raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    return ChatRequest(_messages(body.get("messages")), tools, choice,
                       opt_int(body, "max_completion_tokens", "max_tokens"),
                       opt_int(body, "n", hi=MAX_N) or 1, _stop(body), name, bool(logprobs), top,
                       response_schema(body.get("response_format")))


@dataclass
class CompletionRequest:
    prompt: str
    prompt_ids: list[int] | None
    max_tokens: int | None
    n: int
    stop: list[str]
    logprobs: int | None = None  # return the sampled tokens' logprobs, with this many alternatives


def completion_request(body) -> CompletionRequest:
    body = body_dict(body)
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    ids = None
    if isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool)
                                         and 0 <= x < 1 << 24
                                         for x in p):
        ids = list(p)
    elif not isinstance(p, str) or not p:
        raise bad("prompt must be a non-empty string or a list of token ids", "prompt")
    return CompletionRequest(p if ids is None else "", ids, opt_int(body, "max_tokens") or 16,
                             opt_int(body, "n", hi=MAX_N) or 1, _stop(body),
                             opt_int(body, "logprobs", lo=0, hi=MAX_COMPLETION_TOP))


def strings_in(value) -> list[str]:
    """Every string in a parsed JSON value (keys included), iteratively: what a rendered prompt
    holds at least."""
    out, todo = [], [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            out.extend(k for k in v if isinstance(k, str))
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
    return out


def check_token_ids(ids: list[int], vocab: int) -> None:
    """400 naming the first id that is not a token of the run's tokenizer (0 .. vocab - 1): another
    tokenizer's ids, or an attacker's, never reach the engine."""
    for i, x in enumerate(ids):
        if x >= vocab:
            raise bad(f"prompt[{i}] = {x} is not a token id of this model's tokenizer "
                       f"(0..{vocab - 1})", f"prompt[{i}]")


# ---- responses ----

def chat_choice(index: int, message: dict, reason: str, logprobs: dict | None = None) -> dict:
    return {"index": index, "message": message, "finish_reason": reason, "logprobs": logprobs}


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def chat_completion(model: str, choices: list[dict], prompt_tokens: int,
                    completion_tokens: int) -> dict:
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate({
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()),
        "model": model, "choices": choices, "usage": _usage(prompt_tokens, completion_tokens),
    }).model_dump(mode="json", exclude_none=True)


def completion(model: str, texts: list[tuple[str, str, dict | None]], prompt_tokens: int,
               completion_tokens: int) -> dict:
    from openai.types import Completion

    return Completion.model_validate({
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
        "model": model, "usage": _usage(prompt_tokens, completion_tokens),
        "choices": [{"index": i, "text": t, "finish_reason": r, "logprobs": lp} for i,
                    (t, r, lp) in enumerate(texts)],
    }).model_dump(mode="json", exclude_none=True)


def sse(result: dict):
    """A finished chat completion or completion as a server-sent-event stream of chunks."""
    if result.get("object") == "chat.completion":
        for ch in result["choices"]:
            delta = {"role": "assistant", "content": ch["message"].get("content")}
            if ch["message"].get("tool_calls"):
                delta["tool_calls"] = [{"index": j, **c} for j,
                                       c in enumerate(ch["message"]["tool_calls"])]
            for d, reason, lps in ((delta, None, ch.get("logprobs")),
                                   ({}, ch["finish_reason"], None)):
                choice = {"index": ch["index"], "delta": d, "finish_reason": reason}
                if lps is not None:  # every token's, in the chunk that holds the whole text
                    choice["logprobs"] = lps
                chunk = {"id": result["id"], "object": "chat.completion.chunk",
                         "created": result["created"], "model": result["model"],
                         "choices": [choice]}
                yield f"data: {json.dumps(chunk)}\n\n"
    else:
        yield f"data: {json.dumps(result)}\n\n"
    yield "data: [DONE]\n\n"

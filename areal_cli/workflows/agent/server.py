"""The rollout worker's OpenAI-compatible endpoint (FastAPI on uvicorn, loopback only).

Routes, each also under ``/episodes/<key>/v1/...`` (the base URL a workflow=agent episode's client
gets, so its calls are recorded into that episode): ``GET /v1/models``, ``POST
/v1/chat/completions`` (messages, tools / tool_choice, response_format, max_tokens /
max_completion_tokens, n, stop, stream, logprobs; a required call or a response format is decoded
under a grammar, constraints.py), ``POST /v1/responses`` (the Responses API: text and function
tools, text.format, streamed and chained by previous_response_id: ``responses.py``),
``POST /v1/completions``, and Anthropic's ``POST /v1/messages`` (and
``/v1/messages/count_tokens``), served as the chat call it converts to (``anthropic_api.py``). A
call from a Python agent's code carries its episode (``context.py``) and is recorded there,
whatever its URL. Every request needs
``Authorization: Bearer <the worker's token>`` (Anthropic's routes: or ``x-api-key: <token>``); a
missing or wrong one is answered 401 and counted. Bodies are checked here (``requests.py``) and
errors come back in the route's API's shape (``Dialect``; 400 ``context_length_exceeded`` for a
prompt beyond the context).

Sampling is the run's: the trainer recomputes logprobs at ``rollout.temperature`` / ``top_p``, so a
request's temperature, top_p and seed are not applied (an evaluation's engine is greedy). A stream
sends the finished completion as one chunk (the engine hands back whole sequences). Logprobs, where
asked, are the engine's behaviour logprobs of the sampled tokens (``logprobs.py``). An episode's
time with a call in the engine is measured on its clock (``clock.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from areal_cli.workflows.agent import anthropic_api as am
from areal_cli.workflows.agent import logprobs as lp
from areal_cli.workflows.agent import requests as rq
from areal_cli.workflows.agent import responses as rs
from areal_cli.workflows.agent.bridge import EngineBridge
from areal_cli.workflows.agent.chat import ChatRenderer, Reply, normalise
from areal_cli.workflows.agent.constraints import reply_grammar
from areal_cli.workflows.agent.context import HEADER
from areal_cli.workflows.agent.episode import Choice, EpisodeLog
from areal_cli.workflows.agent.serving import (
    DISCONNECTED,
    api_key,
    bearer,
    read_body,
    until_disconnected,
)
from areal_cli.workflows.agent.toolcalls import parse

# metrics.jsonl names
log = logging.getLogger(__name__)

REFUSAL_LOG_S = 60.0
INLINE_TOKENIZE_BYTES = 64 << 10
"""Prompts of up to this many bytes are rendered and tokenized in the endpoint's loop (tens of
microseconds); larger ones in a thread of their own (the tokenizer releases the GIL: a prompt of
megabytes takes seconds, which the other episodes' calls no longer wait for)."""

METRIC = {"tool_calls": "agent_tool_calls", "tool_parse_errors": "tool_parse_errors"}


class Endpoint:
    """What the routes share: the renderer, the engine bridge, the open episodes and the
    counters."""

    def __init__(self, renderer: ChatRenderer, bridge: EngineBridge, token: str, model: str,
                 max_new_tokens: int, context: int, eos_ids: set[int], vocab: int,
                 max_body: int = 4 << 20, max_unattributed: int = 16):
        self.renderer, self.bridge, self.token, self.model = renderer, bridge, token, model
        self.max_new_tokens, self.context, self.eos_ids = max_new_tokens, context, eos_ids
        self.vocab = vocab  # token ids a client may send: those of the run's tokenizer
        self.max_body = max_body  # bytes of a request body
        # sequences of calls outside any episode (plain /v1) in flight, and at most how many: they
        # never crowd out the episodes
        self.unattributed, self.max_unattributed = 0, max_unattributed
        # the most UTF-8 bytes one token stands for (its vocabulary string's bytes: at least that)
        self.token_bytes = max((len(t.encode("utf-8", "surrogatepass"))
                                for t in renderer.tok.get_vocab()), default=1)
        self.episodes: dict[str, EpisodeLog] = {}
        self.text = lp.TokenText(renderer.tok)  # tokens as logprob entries show them
        self.kept = rs.Kept(rs.KEPT_UNATTRIBUTED)  # plain /v1 calls' responses, for chains
        self.counters: Counter = Counter()  # unauthorized, bad_requests, unattributed_calls, ...
        # an encoding sets the tokenizer's truncation and padding where they differ from the call's
        # (a mutation the Rust tokenizer refuses while another thread encodes): settled here once,
        # every later encoding (the loop's, and the thread's for prompts too large for the loop)
        # only reads the tokenizer
        renderer.encode("settle")
        self.tokenize_pool = None
        self.refused: Counter = Counter()  # refusals since the worker started, by kind
        self.refusal_logged: dict[str, float] = {}
        self.connections_opened = 0  # since the worker started (the agents' pool keeps them open)

    def connected(self) -> None:
        self.connections_opened += 1

    def refuse(self, kind: str) -> None:
        """Count a refused request or connection (``kind``: its metric), and log it at most once a
        minute per kind with the count since the worker started."""
        self.counters[kind] += 1
        self.refused[kind] += 1
        now = time.monotonic()
        if now - self.refusal_logged.get(kind, -REFUSAL_LOG_S) >= REFUSAL_LOG_S:
            self.refusal_logged[kind] = now
            log.warning("agent endpoint: %s (%d since the worker started; logged at most once a "
                        "minute)", kind, self.refused[kind])

    def authorized(self, key: str | None) -> bool:
        """Whether ``key`` (what the request sent: ``Dialect.key``) is the worker's token."""
        ok = bool(key) and hmac.compare_digest(key.encode(), self.token.encode())
        if not ok:
            self.refuse("agent_unauthorized")
        return ok

    def caller(self, headers, key: str | None) -> str | None:
        """The episode a call is recorded into: the one whose code made it (``context.HEADER``, sent
        by a Python agent's clients, handed in or not), else the one its URL names (None: plain
        ``/v1``). A call whose URL names another episode, or none, is counted as rerouted."""
        made_by = headers.get(HEADER)
        if made_by is None or made_by == key:
            return key
        self.counters["agent_rerouted_calls"] += 1
        return made_by

    def episode(self, key: str | None) -> EpisodeLog | None:
        if key is None:
            return None
        ep = self.episodes.get(key)
        if ep is None or ep.closed:
            raise rq.ApiError(404, f"no open episode {key!r} (it ended or timed out)",
                              "not_found_error")
        return ep

    # ---- one call: generate, record, parse ----

    async def _generate(self, ep: EpisodeLog | None, prompt_ids: list[int], max_tokens: int | None,
                        n: int, stop: list[str], top: int = 0,
                        top_param: str = "top_logprobs", grammar: str = "") -> list[Choice]:
        budget = min(max_tokens or self.max_new_tokens, self.max_new_tokens)
        lp.check_top(top, getattr(self.bridge.engine, "top_logprobs", 0), top_param)
        if len(prompt_ids) + budget > self.context:
            raise rq.ApiError(400, f"this request has {len(prompt_ids)} prompt tokens and asks for "
                              f"{budget}; the context is {self.context} "
                              "tokens", "invalid_request_error",
                              "context_length_exceeded", "messages")
        if ep is not None:
            if ep.started >= ep.max_calls:
                raise rq.ApiError(400,
                                  f"this episode has made its {ep.max_calls} calls "
                                  "(workflow.max_turns)",
                                  "invalid_request_error", "too_many_calls")
            ep.started += 1
        else:
            if self.unattributed + n > self.max_unattributed:
                self.refuse("agent_refused_unattributed")
                raise rq.ApiError(429, f"{self.unattributed} sequences of calls outside an episode "
                                  f"are in flight and this call asks for {n}; at most "
                                  f"{self.max_unattributed} at once "
                                  "(workflow.agent_unattributed_sequences; call through the "
                                  "episode's client)", "rate_limit_error",
                                  "too_many_unattributed")
            self.counters["agent_unattributed_calls"] += 1
            self.unattributed += n
        try:
            with ep.clock.in_engine() if ep is not None else contextlib.nullcontext():
                seqs = await asyncio.gather(*(self.bridge.generate(prompt_ids, budget, top,
                                                                   grammar)
                                              for _ in range(n)))
        finally:
            if ep is None:
                self.unattributed -= n
        choices = [self._choice(s, stop, bool(grammar)) for s in seqs]
        if ep is not None and not ep.closed:
            ep.record(list(prompt_ids), choices)
        return choices

    def _choice(self, seq, stop: list[str], constrained: bool) -> Choice:
        ids, logps, versions = list(seq.output_ids), list(seq.logprobs), list(seq.versions)
        top, reason, hit, routing = list(seq.top), seq.finish_reason, "", list(seq.routing)
        if stop:
            cut = self._stop_at(ids, stop)
            if cut is not None:
                ids, logps, versions, reason = ids[:cut], logps[:cut], versions[:cut], "stop"
                top, routing = top[:cut], routing[:len(seq.prompt_ids) + cut]
                text = self.renderer.tok.decode(ids, skip_special_tokens=True)
                hit = next(s for s in stop if s in text)
        return Choice(ids, logps, versions, reason or "stop", stop=hit, top=top, routing=routing,
                      constrained=constrained)

    def _stop_at(self, ids: list[int], stop: list[str]) -> int | None:
        """The fewest leading tokens whose text holds a stop string (None: none occurs)."""
        text = self.renderer.tok.decode(ids, skip_special_tokens=True)
        if not any(s in text for s in stop):
            return None
        for k in range(1, len(ids) + 1):
            part = self.renderer.tok.decode(ids[:k], skip_special_tokens=True)
            if any(s in part for s in stop):
                return k
        return None

    def _text(self, choice: Choice, stop: list[str]) -> str:
        text = self.renderer.tok.decode(choice.output_ids, skip_special_tokens=True)
        for s in stop:
            text = text.split(s, 1)[0] if s in text else text
        return text

    async def _tokenized(self, size: int, fn, *args):
        """``fn(*args)`` (rendering or tokenizing a prompt of ``size`` bytes) in the loop when it is
        small, else in the tokenizing thread (one at a time there): the loop never waits for a large
        one."""
        if size <= INLINE_TOKENIZE_BYTES:
            return fn(*args)
        if self.tokenize_pool is None:
            import concurrent.futures as cf

            self.tokenize_pool = cf.ThreadPoolExecutor(1, thread_name_prefix="agent-tokenize")
        return await asyncio.get_running_loop().run_in_executor(self.tokenize_pool, fn, *args)

    def _fits(self, texts) -> int:
        """The context check before tokenizing: a prompt holding ``texts`` has at least their UTF-8
        bytes / the longest token's bytes tokens; past the context it is refused without the
        tokenizer's work (which holds the endpoint's loop for seconds at megabytes)."""
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        least = size // max(1, self.token_bytes)
        if least > self.context:
            raise rq.ApiError(400, f"this request's text is {size} bytes, at least {least} tokens; "
                              f"the context is {self.context} tokens", "invalid_request_error",
                              "context_length_exceeded", "messages")
        return size

    async def chat(self, body: dict, key: str | None) -> dict:
        req = rq.chat_request(body)
        answers, prompt_tokens = await self._chat(req, key)
        return rq.chat_completion(self.model, [
            rq.chat_choice(i, m, r, lp.chat_logprobs(self.text, c, req.top_logprobs)
                           if req.logprobs else None) for i, (m, r, c) in enumerate(answers)],
            prompt_tokens, sum(len(c.output_ids) for *_, c in answers))

    async def messages(self, body: dict, key: str | None) -> dict:
        """Anthropic's Messages API: the body as a chat request, its reply as a ``Message``."""
        req = am.messages_request(body)
        [(message, reason, c)], prompt_tokens = await self._chat(req, key)
        return am.message(self.model, message, reason, c.stop if c.stop in req.stop else None,
                          prompt_tokens, len(c.output_ids))

    async def count_tokens(self, body: dict, key: str | None) -> dict:
        """Anthropic's ``/v1/messages/count_tokens``: the prompt tokens a Messages call with this
        body would send the engine (nothing generated, nothing recorded)."""
        req = am.messages_request(body, counting=True)
        ep = self.episode(key)
        size = self._fits(rq.strings_in([req.messages, req.tools]))
        prompt = await self._tokenized(size, self.renderer.prompt, req.messages, req.tools,
                                       ep.replies if ep else [])
        return {"input_tokens": len(prompt.ids)}

    async def _chat(self, req: rq.ChatRequest,
                    key: str | None) -> tuple[list[tuple[dict, str, Choice]], int]:
        """Serve a chat request: per choice (the assistant message, its finish reason, the recorded
        choice), and the prompt's tokens."""
        ep = self.episode(key)
        size = self._fits(rq.strings_in([req.messages, req.tools]))
        prompt = await self._tokenized(size, self.renderer.prompt, req.messages, req.tools,
                                       ep.replies if ep else [])
        # a required call or a response format: decoded under its grammar (constraints.py)
        grammar = reply_grammar(self.renderer.style, req)
        ids = prompt.ids
        choices = await self._generate(ep, ids, req.max_tokens, req.n, req.stop,
                                       req.top_logprobs, grammar=grammar)
        out = []
        for c in choices:
            text = self._text(c, req.stop)
            parsed = parse(self.renderer.style,
                           text) if req.tools and req.tool_choice != "none" else None
            message = {"role": "assistant", "content": text}
            reason = c.finish_reason
            if parsed is not None and parsed.error:
                self._count(ep, "tool_parse_errors")
                reason = "stop"
            elif parsed is not None and parsed.tool_calls:
                message = {"role": "assistant", "content": parsed.content,
                           "tool_calls": parsed.tool_calls}
                reason = "tool_calls"
                self._count(ep, "tool_calls", len(parsed.tool_calls))
            c.reply = Reply(req.messages + normalise([message]), ids + c.output_ids,
                            bool(c.output_ids) and c.output_ids[-1] in self.eos_ids)
            if ep is not None:
                ep.replies.append(c.reply)
                ep.last_text = text
            out.append((message, reason, c))
        return out, len(prompt.ids)

    async def responses(self, body: dict, key: str | None) -> dict:
        """The Responses API: served as the chat call it converts to, after the conversation of
        ``previous_response_id``; kept for a later call to continue (``responses.py``)."""
        req = rs.responses_request(body)
        ep = self.episode(key)
        kept = ep.responses if ep is not None else self.kept
        chat = rq.chat_request(req.as_chat(kept.get(req.previous)))
        [(message, _, c)], prompt_tokens = await self._chat(chat, key)
        out = rs.response(self.model, message, (prompt_tokens, len(c.output_ids)), req,
                          lp.entries(self.text, c, req.top_logprobs) if req.logprobs else None)
        if req.store:
            kept.put(out["id"], rs.conversation(c.reply.messages, req))
        return out

    async def completions(self, body: dict, key: str | None) -> dict:
        req = rq.completion_request(body)
        ep = self.episode(key)
        if req.prompt_ids is not None:
            rq.check_token_ids(req.prompt_ids, self.vocab)
            ids = req.prompt_ids
        else:
            ids = await self._tokenized(self._fits([req.prompt]), self.renderer.encode, req.prompt)
        top = req.logprobs or 0
        choices = await self._generate(ep, ids, req.max_tokens, req.n, req.stop, top, "logprobs")
        texts = [self._text(c, req.stop) for c in choices]
        if ep is not None and texts:
            ep.last_text = texts[-1]
        return rq.completion(self.model, [
            (t, c.finish_reason, lp.completion_logprobs(self.text, c, top)
             if req.logprobs is not None else None) for t, c in zip(texts, choices, strict=True)],
            len(ids), sum(len(c.output_ids) for c in choices))

    def _count(self, ep: EpisodeLog | None, what: str, n: int = 1) -> None:
        """Count ``what`` (an EpisodeLog counter) in its episode, or endpoint-wide for a plain /v1
        call."""
        if ep is not None:
            setattr(ep, what, getattr(ep, what) + n)
        else:
            self.counters[METRIC[what]] += n


@dataclass(frozen=True)
class Dialect:
    """What differs between the APIs the routes speak."""

    key: Callable  # the request's headers → the API key it sent (None: none)
    error: Callable  # an ApiError → its body
    stream: Callable  # a finished result → its server-sent events (strings)


OPENAI = Dialect(bearer, rq.ApiError.body, rq.sse)
RESPONSES = Dialect(bearer, rq.ApiError.body, rs.sse)
ANTHROPIC = Dialect(api_key, am.error_body, am.sse)


def build_app(endpoint: Endpoint):
    """The FastAPI application serving ``endpoint``."""
    app = FastAPI(title="areal rollout endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    def refused(err: rq.ApiError, dialect: Dialect) -> JSONResponse:
        return JSONResponse(dialect.error(err), status_code=err.status)

    def unauthorized(dialect: Dialect) -> JSONResponse:
        return refused(rq.ApiError(401, "a missing or wrong API key: use the run's token",
                                   "invalid_request_error", "invalid_api_key"), dialect)

    async def serve(request: Request, handler, key: str | None, dialect: Dialect = OPENAI):
        if not endpoint.authorized(dialect.key(request.headers)):
            return unauthorized(dialect)
        key = endpoint.caller(request.headers, key)
        try:
            raw = await read_body(request, endpoint.max_body)
        except ClientDisconnect:  # gone before its request arrived whole: no one to answer
            endpoint.refuse("agent_disconnected")
            return Response(status_code=499)
        if raw is None:
            endpoint.refuse("agent_refused_large")
            return refused(rq.ApiError(413, f"the body is larger than {endpoint.max_body} bytes "
                                       "(workflow.agent_max_body_mb)", "invalid_request_error",
                                       "request_too_large"), dialect)
        try:
            body = json.loads(raw or b"null")
        except (ValueError, RecursionError) as err:  # not JSON, not UTF-8, or nested too deep
            endpoint.refuse("agent_bad_requests")
            why = ("nested deeper than the parser's limit" if isinstance(err, RecursionError)
                   else err)
            return refused(rq.ApiError(400, f"the body is not JSON ({why})"), dialect)
        stream = isinstance(body, dict) and bool(body.get("stream"))
        try:
            result = await until_disconnected(request, handler(body, key))
            if result is DISCONNECTED:  # its generation is stopped in the engine (bridge.pump)
                endpoint.refuse("agent_disconnected")
                return Response(status_code=499)
        except rq.ApiError as err:
            endpoint.refuse("agent_bad_requests")
            return refused(err, dialect)
        if stream:
            return StreamingResponse(dialect.stream(result), media_type="text/event-stream")
        return JSONResponse(result)

    for prefix in ("/v1", "/episodes/{key}/v1"):
        @app.get(prefix + "/models")
        async def models(request: Request, key: str | None = None):
            # either client lists models: answered in the shape both read
            dialect = ANTHROPIC if "anthropic-version" in request.headers else OPENAI
            if not endpoint.authorized(api_key(request.headers)):
                return unauthorized(dialect)
            now = time.time()
            model = {"id": endpoint.model, "object": "model", "created": int(now),
                     "owned_by": "areal", "type": "model", "display_name": endpoint.model,
                     "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
            return {"object": "list", "data": [model], "has_more": False,
                    "first_id": endpoint.model, "last_id": endpoint.model}

        @app.post(prefix + "/chat/completions")
        async def chat(request: Request, key: str | None = None):
            return await serve(request, endpoint.chat, key)

        @app.post(prefix + "/responses")
        async def responses(request: Request, key: str | None = None):
            return await serve(request, endpoint.responses, key, RESPONSES)

        @app.post(prefix + "/completions")
        async def completions(request: Request, key: str | None = None):
            return await serve(request, endpoint.completions, key)

        @app.post(prefix + "/messages")
        async def messages(request: Request, key: str | None = None):
            return await serve(request, endpoint.messages, key, ANTHROPIC)

        @app.post(prefix + "/messages/count_tokens")
        async def count_tokens(request: Request, key: str | None = None):
            return await serve(request, endpoint.count_tokens, key, ANTHROPIC)

    return app

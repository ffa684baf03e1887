"""Logprobs on request: the engine's behaviour logprob of each sampled token (the number the trainer
receives for it), in the shape each API returns them.

Chat (``logprobs: true``, ``top_logprobs``) and the Responses API (``include:
["message.output_text.logprobs"]``, ``top_logprobs``) get one entry per sampled token — ``token``
(its text), ``bytes`` (its UTF-8 bytes: a token may hold part of a character), ``logprob`` and
``top_logprobs`` — and /v1/completions (``logprobs: <k>``) its ``tokens`` / ``token_logprobs``.
Alternatives (``top_logprobs`` > 0) are the engine's where it returns them
(``Engine.top_logprobs``); an engine that returns the sampled token's logprob alone answers such a
request 400, naming why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal_cli.workflows.agent.requests import MAX_TOP, ApiError

if TYPE_CHECKING:
    from areal_cli.workflows.agent.episode import Choice


def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's ``bytes_to_unicode``) inverted: its printable stand-in of
    each byte → the byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class TokenText:
    """A tokenizer's tokens as logprob entries show them: text and exact bytes, cached per id."""

    def __init__(self, tokenizer):
        self.tok, self.cache = tokenizer, {}
        self.decoder = _byte_decoder()

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self.cache.get(token_id)
        if hit is None:
            text = self.tok.decode([token_id], skip_special_tokens=False)
            piece = self.tok.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece and all(ch in self.decoder for ch in piece) \
                    and token_id not in self.tok.all_special_ids:
                raw = bytes(self.decoder[ch] for ch in piece)  # byte-level BPE: its own bytes
            else:
                raw = text.encode("utf-8")
            hit = self.cache[token_id] = (text, list(raw))
        return hit


def check_top(asked: int, engine_top: int, param: str = "top_logprobs") -> None:
    """400 when a request asks for more alternatives per token than the engine returns."""
    if asked <= engine_top:
        return
    if engine_top == 0:
        why = (f"this run's engine returns the sampled token's logprob alone, no alternatives "
               f"(engine=vllm returns up to {MAX_TOP}): leave {param} out; the sampled tokens' "
               "logprobs still come back")
    else:
        why = f"this run's engine returns at most {engine_top} alternatives per token"
    raise ApiError(400, f"{param}={asked}: {why}", "invalid_request_error", None, param)


def entries(text: TokenText, choice: Choice, top: int) -> list[dict]:
    """One ``{token, bytes, logprob, top_logprobs}`` per sampled token of ``choice``."""
    out = []
    for i, (tid, lp) in enumerate(zip(choice.output_ids, choice.logprobs, strict=True)):
        token, raw = text(tid)
        alts = choice.top[i][:top] if top and i < len(choice.top) else []
        out.append({"token": token, "bytes": raw, "logprob": float(lp),
                    "top_logprobs": [dict(zip(("token", "bytes"), text(a), strict=True),
                                          logprob=float(alp)) for a, alp in alts]})
    return out


def chat_logprobs(text: TokenText, choice: Choice, top: int) -> dict:
    """A chat choice's ``logprobs``."""
    return {"content": entries(text, choice, top), "refusal": None}


def completion_logprobs(text: TokenText, choice: Choice, top: int) -> dict:
    """A /v1/completions choice's ``logprobs`` (the legacy shape)."""
    rows = entries(text, choice, top)
    offsets, at = [], 0
    for r in rows:
        offsets.append(at)
        at += len(r["token"])
    return {"tokens": [r["token"] for r in rows], "token_logprobs": [r["logprob"] for r in rows],
            "top_logprobs": [{a["token"]: a["logprob"] for a in r["top_logprobs"]} for r in rows]
            if top else None, "text_offset": offsets}

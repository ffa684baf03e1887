"""Constrained decoding on the hf engine (the CPU's slot loop): what the grammar buys, what its mask
costs per token, and how far the behaviour logprobs of constrained tokens are from the model's.

    .venv/bin/python benchmarks/constrained_decoding.py [--prompts 4] [--samples 8]
                                                        [--tokens 96] [--seed 0]

SmolLM2-135M-Instruct (the default model), the run's default sampling (temperature 1), prompts
rendered as the agent endpoint renders them (the tool offered in the system message, Hermes
format). Two requests, each sampled ``--samples`` times per prompt, with and without the grammar:

- ``tool``: tool_choice naming a ``calculate`` tool (``{"expression": string}``): does the reply
  parse into that call?
- ``json``: response_format with a schema (``{"answer": integer, "confidence": "low" | "high"}``),
  the free reply asked for the same JSON in the prompt: is it JSON of the schema?

Prints, per request: the share that parsed with and without the grammar; the mask's cost per
constrained token (llguidance's bitmask, unpacked and applied to the logits row) against the whole
step's time per token; and the logprob gap of the constrained tokens: behaviour logprob (of the
masked distribution, what the engine records) minus the unmasked model's logprob of the same token
(what the trainer recomputes), from a teacher-forced forward of the same weights; its mean per
token, the share of tokens with a gap above 0.01 nats, and the mean sum per reply. Then a JSON
summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import hf_engine  # noqa: E402

from areal_cli.engines.base import Sequence  # noqa: E402
from areal_cli.model_source import resolve_model  # noqa: E402
from areal_cli.workflows.agent import requests as rq  # noqa: E402
from areal_cli.workflows.agent.chat import ChatRenderer  # noqa: E402
from areal_cli.workflows.agent.constraints import reply_grammar  # noqa: E402
from areal_cli.workflows.agent.toolcalls import detect, parse  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]
SCHEMA = {"type": "object", "required": ["answer", "confidence"],
          "properties": {"answer": {"type": "integer"}, "confidence": {"enum": ["low", "high"]}}}
ASK_JSON = ('Reply with JSON only: {"answer": <integer>, "confidence": "low" or "high"}.')


def requests(n: int) -> list[tuple[str, dict]]:
    """(kind, chat body) per prompt and kind."""
    out = []
    for i in range(n):
        q = f"What is {17 + 7 * i} * {3 + i} - {5 + 2 * i}?"
        msgs = [{"role": "user", "content": q}]
        out.append(("tool", {"messages": msgs, "tools": TOOLS, "tool_choice": {
            "type": "function", "function": {"name": "calculate"}}}))
        out.append(("json", {"messages": [{"role": "user", "content": f"{q} {ASK_JSON}"}],
                             "response_format": {"type": "json_schema", "json_schema": {
                                 "name": "answer", "schema": SCHEMA}}}))
    return out


def parsed(kind: str, style, text: str) -> bool:
    if kind == "tool":
        calls = parse(style, text).tool_calls
        return len(calls) == 1 and calls[0]["function"]["name"] == "calculate" and isinstance(
            json.loads(calls[0]["function"]["arguments"]).get("expression"), str)
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return (isinstance(obj, dict) and set(obj) == {"answer", "confidence"}
            and isinstance(obj["answer"], int) and obj["confidence"] in ("low", "high"))


@torch.no_grad()
def gaps(model, seq: Sequence) -> list[float]:
    """Behaviour logprob minus the unmasked model's logprob, per generated token."""
    ids = torch.tensor([seq.prompt_ids + seq.output_ids])
    logits = model(ids).logits[0, len(seq.prompt_ids) - 1: -1].float()
    free = torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq.output_ids)[:, None])[:, 0]
    return (torch.tensor(seq.logprobs) - free).tolist()


def run(eng, seqs: list[Sequence]) -> float:
    for s in seqs:
        eng.submit(s)
    t0, done = time.perf_counter(), []
    while len(done) < len(seqs):
        done += eng.poll(0.1)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(path)
    style = detect(tok)
    renderer = ChatRenderer(tok, style)
    eng = hf_engine(path, sequences=a.samples, kv_cache_tokens=a.samples * 1024,
                    eos_token_id=tok.eos_token_id)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(a.seed)
    rows: dict[str, dict] = {}
    for kind, body in requests(a.prompts):
        req = rq.chat_request(body)
        ids = renderer.prompt(req.messages, req.tools, []).ids
        grammar = reply_grammar(style, req)
        for constrained in (True, False):
            r = rows.setdefault(f"{kind} {'grammar' if constrained else 'free'}",
                                {"ok": 0, "n": 0, "tokens": 0, "s": 0.0, "gaps": [], "sums": []})
            seqs = [Sequence(f"{kind}{constrained}{i}", ids, a.tokens,
                             grammar=grammar if constrained else "") for i in range(a.samples)]
            before = (eng.grammars.mask_s, eng.grammars.masked)
            r["s"] += run(eng, seqs)
            r["mask_s"] = r.get("mask_s", 0.0) + eng.grammars.mask_s - before[0]
            r["masked"] = r.get("masked", 0) + eng.grammars.masked - before[1]
            for s in seqs:
                text = tok.decode(s.output_ids, skip_special_tokens=True)
                ok = parsed(kind, style, text)
                r["ok"] += ok
                if constrained and not ok:
                    print(f"not parsed ({s.finish_reason}, {len(s.output_ids)} tokens): "
                          f"{text[:300]!r}", flush=True)
                r["n"] += 1
                r["tokens"] += len(s.output_ids)
                if constrained:
                    g = gaps(model, s)
                    r["gaps"] += g
                    r["sums"].append(sum(g))
    eng.close()
    summary = {"cpu": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    for name, r in rows.items():
        line = {"parsed": f"{r['ok']}/{r['n']}", "ms_per_token": 1e3 * r["s"] / r["tokens"]}
        if r["gaps"]:
            g = torch.tensor(r["gaps"])
            line.update(mask_ms_per_token=1e3 * r["mask_s"] / max(1, r["masked"]),
                        gap_mean=g.mean().item(), gap_over_0_01=(g > 0.01).float().mean().item(),
                        gap_max=g.max().item(), gap_sum_per_reply=sum(r["sums"]) / len(r["sums"]),
                        tokens=len(r["gaps"]))
        summary[name] = line
        print(name, " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in line.items()), flush=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""Constrained decoding on a GPU: the vLLM engine (its structured outputs, llguidance backend) and
the hf engine's paged path (the grammar as a logits processor of transformers' continuous batching)
both return, for each sequence with a grammar that ends by it (all of the hf engine's), a reply
its grammar takes whole, across a weight update that interrupts it; their logprobs are those of
the masked distribution (every forced token, probability 1 under the mask, has logprob ~0). The
default model, its real weights, temperature 1."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from areal_cli.engines.base import EngineSetup, Sampling, Sequence
from areal_cli.model_source import resolve_model
from areal_cli.workflows.agent import requests as rq
from areal_cli.workflows.agent.constraints import json_grammar, reply_grammar
from areal_cli.workflows.agent.toolcalls import detect, parse

TOOLS = [{"type": "function", "function": {
    "name": "calculate", "parameters": {"type": "object", "required": ["expression"],
                                        "properties": {"expression": {"type": "string"}}}}}]
SCHEMA = {"type": "object", "required": ["answer", "confidence"],
          "properties": {"answer": {"type": "integer"}, "confidence": {"enum": ["low", "high"]}}}


def _engine(name: str):
    from areal_cli.config.schema import EngineConfig
    from areal_cli.engines.factory import make_engine
    from areal_cli.runconfig.autos import resolve_engine
    from areal_cli.tasks import load_tokenizer

    path = resolve_model("smollm2-135m-instruct")
    tok = load_tokenizer(path)
    kw = {"gpu_memory_utilization": 0.3} if name == "vllm" else {}
    e = resolve_engine(EngineConfig(name=name, **kw), updates=False)
    return make_engine(EngineSetup(e, path, tok.eos_token_id, Sampling(1.0), sequences=16,
                                   context=1024, device="cuda:0")), tok


def _requests(tok):
    """(grammar, prompt ids, check of the reply's text): a required call and a JSON reply."""
    from areal_cli.workflows.agent.chat import ChatRenderer

    style = detect(tok)
    renderer = ChatRenderer(tok, style)
    call = rq.chat_request({"messages": [{"role": "user", "content": "What is 17 * 3 - 5?"}],
                            "tools": TOOLS, "tool_choice": "required"})

    def is_call(text):
        return len(parse(style, text).tool_calls) == 1

    def is_json(text):
        obj = json.loads(text)
        return set(obj) == {"answer", "confidence"} and obj["confidence"] in ("low", "high")

    ask = [{"role": "user", "content": "What is 24 * 4 - 7? Reply with JSON."}]
    return [(reply_grammar(style, call), renderer.prompt(call.messages, call.tools, []).ids,
             is_call),
            (json_grammar(SCHEMA), tok.apply_chat_template(ask, add_generation_prompt=True,
                                                           tokenize=True, return_dict=False),
             is_json)]


@pytest.mark.parametrize("name", ["vllm", "hf"])
def test_every_constrained_reply_is_whole_across_an_update(name, monkeypatch):
    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM")
    # pytest's process has touched CUDA by now: vLLM's engine core must not be a fork of it
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    eng, tok = _engine(name)
    try:
        seqs, checks = [], {}
        for k, (grammar, ids, check) in enumerate(_requests(tok)):
            for i in range(8):
                seqs.append(Sequence(f"{k}-{i}", list(ids), 128, grammar=grammar))
                checks[seqs[-1].rid] = check
        for s in seqs:
            eng.submit(s)
        done, polls = [], 0
        while len(done) < len(seqs) and polls < 20000:
            done += eng.poll(0.01)
            polls += 1
            if polls == 3:  # interrupted with tokens in flight; the same weights come back
                with eng.paused(1):
                    pass
        assert len(done) == len(seqs)
        whole = [s for s in done if s.finish_reason == "stop"]
        # the hf engine steers a reply to close near its budget; vLLM does not (a rambling string
        # can meet the budget there), so most, not all, of its replies end by the grammar
        assert len(whole) == len(seqs) if name == "hf" else len(whole) >= len(seqs) - 2
        for s in whole:
            text = tok.decode(s.output_ids, skip_special_tokens=True)
            assert checks[s.rid](text), (s.rid, text)
            assert max(s.logprobs) > -1e-3  # a forced token: probability 1 under the mask
    finally:
        eng.close()
    assert torch.cuda.is_available()

"""Where a decode step of the hf engine goes on the CPU, and the two batchings side by side.

    .venv/bin/python benchmarks/cpu_decode.py [--batch 8 32] [--threads 1] [--tokens 64]
                                              [--rounds 3] [--dtype auto|bfloat16|float32]

SmolLM2-135M-Instruct in ``--dtype`` (auto: the CPU's native dtype, config/cpu_dtype.py),
prompts of the default task (~50 tokens). Prints one line per measurement and a JSON summary:

- ``forward``: the bare model forward of one decode step at batch B over a ~100-token context
  (transformers' DynamicCache), split into the model up to its last hidden state, the lm head, and
  sampling (softmax, multinomial, the sampled token's logprob) over the 49k vocabulary;
- ``engine``: the engine through its interface (submit, poll), B sequences of ``--tokens`` tokens
  (EOS ignored), ``engine.hf.cpu_batching=slots`` and ``paged`` interleaved, ``--rounds`` times
  each, in tokens/s, with the load average next to each figure: the 2-core machine is often shared,
  so compare the two of one round, not figures of different runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import hf_engine  # noqa: E402

from areal_cli.engines.base import (
    Sampling,  # noqa: E402
    Sequence,  # noqa: E402
)
from areal_cli.engines.hf.slots import sample  # noqa: E402
from areal_cli.model_source import resolve_model  # noqa: E402


def load() -> float:
    return round(os.getloadavg()[0], 2)


def prompts(tok, n: int) -> list[list[int]]:
    """n chat prompts of the default task's shape (a few lengths)."""
    out = []
    for i in range(n):
        msg = f"What is {17 + i} + {40 + 3 * i}? End with 'Answer: N'." + " Think." * (i % 4)
        ids = tok.apply_chat_template([{"role": "user", "content": msg}], tokenize=True,
                                      add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


@torch.no_grad()
def forward_split(model, batch: list[list[int]], steps: int = 16) -> dict:
    """ms per decode step: model body, lm head, sampling (one step = all three)."""
    from transformers import DynamicCache

    width = max(map(len, batch))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
    mask = (torch.arange(width)[None]
            >= torch.tensor([width - len(p) for p in batch])[:, None]).long()
    cache = DynamicCache(config=model.config)
    out = model(ids, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1].float().argmax(-1)[:, None]
    body = head = samp = 0.0
    for _ in range(steps):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        a = time.perf_counter()
        h = model.model(input_ids=nxt, attention_mask=mask, past_key_values=cache,
                        use_cache=True).last_hidden_state
        b = time.perf_counter()
        logits = model.lm_head(h[:, -1]).float()
        c = time.perf_counter()
        tok, _ = sample(logits, Sampling(1.0))
        d = time.perf_counter()
        nxt = tok[:, None]
        body, head, samp = body + b - a, head + c - b, samp + d - c
    ms = {k: round(1000 * v / steps, 1) for k,
          v in (("body_ms", body), ("head_ms", head), ("sample_ms", samp))}
    step = sum(ms.values())
    return ms | {"step_ms": round(step, 1), "tokens_s": round(1000 * len(batch) / step, 1),
                 "load": load()}


def engine_round(eng, batch: list[list[int]], tokens: int, tag: str) -> float:
    for i, p in enumerate(batch):
        eng.submit(Sequence(f"{tag}-{i}", p, tokens, ignore_eos=True))
    t0, done = time.perf_counter(), []
    while len(done) < len(batch):
        done += eng.poll(0.05)
    return sum(len(s.output_ids) for s in done) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    args = ap.parse_args()
    from areal_cli.config.cpu_dtype import choose

    dtype = choose().dtype if args.dtype == "auto" else args.dtype
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    path = resolve_model("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    summary: dict = {"threads": args.threads, "tokens": args.tokens, "dtype": dtype}
    for b in args.batch:
        batch = prompts(tok, b)
        split = forward_split(model, batch)
        print(f"B={b} forward: {json.dumps(split)}", flush=True)
        engines = {name: hf_engine(path, dtype=dtype, max_batch_tokens=2048, page_size=64,
                                   sequences=b,
                                   kv_cache_tokens=b * 192, cpu_batching=name)
                   for name in ("slots", "paged")}
        rates: dict = {name: [] for name in engines}
        for r in range(args.rounds + 1):
            for name, eng in engines.items():
                rate = engine_round(eng, batch, args.tokens, f"{r}")
                if r:  # round 0 warms up
                    rates[name].append(rate)
                    print(f"B={b} round {r} {name}: {rate:.0f} tokens/s (load {load()})",
                          flush=True)
        for eng in engines.values():
            eng.close()
        med = {name: round(statistics.median(v), 1) for name, v in rates.items()}
        summary[f"B={b}"] = {"forward": split, "engine_tokens_s": med,
                             "slots_over_paged": round(med["slots"] / med["paged"], 2)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

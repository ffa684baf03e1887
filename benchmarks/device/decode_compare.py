"""Decode tokens/s through the project's Engine interface, one engine per process (prints JSON).

    python3 benchmarks/device/decode_compare.py vllm|hf MODEL_DIR OUT.json [N] [MAX_NEW]

Same prompts for both ("Write a short story about ..."; chat template), T = 1, N sequences of
at most MAX_NEW new tokens submitted at once; the time from the first submit to the last finish.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from areal_cli.config.schema import EngineConfig
from areal_cli.engines.base import EngineSetup, Sampling, Sequence
from areal_cli.engines.factory import make_engine
from areal_cli.runconfig.autos import resolve_engine


def build(kind: str, model_dir: str, tok):
    if kind == "vllm":
        engine = EngineConfig(name="vllm")
    else:
        engine = EngineConfig(name="hf", dtype="bfloat16", max_batch_tokens=8192, kv_cache_tokens=300 * 320,
                              page_size=64)
    engine = resolve_engine(engine, updates=False)  # an engine no weights reach
    return make_engine(EngineSetup(engine, model_dir, tok.eos_token_id, Sampling(1.0), sequences=300,
                                   device="cuda:0" if kind == "hf" else ""))


def main() -> None:
    kind, model_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    max_new = int(sys.argv[5]) if len(sys.argv) > 5 else 256
    import transformers
    from transformers import AutoTokenizer

    from benchmarks.device.vllm_check import prompts

    tok = AutoTokenizer.from_pretrained(model_dir)
    t = time.perf_counter()
    engine = build(kind, model_dir, tok)
    start_s = time.perf_counter() - t
    seqs = [Sequence(f"s{i}", p, max_new) for i, p in enumerate(prompts(tok, n))]
    t0, done = time.perf_counter(), []
    for s in seqs:
        engine.submit(s)
    while len(done) < n:
        done += engine.poll(0.05)
    secs = time.perf_counter() - t0
    tokens = sum(len(s.output_ids) for s in done)
    lengths = sorted(len(s.output_ids) for s in done)
    res = {"engine": kind, "device": torch.cuda.get_device_name(0), "transformers": transformers.__version__,
           "sequences": n, "max_new_tokens": max_new, "tokens": tokens, "seconds": secs,
           "tokens_per_s": tokens / secs, "engine_start_s": start_s,
           "length_p10_p50_p90": [lengths[n // 10], lengths[n // 2], lengths[9 * n // 10]]}
    engine.close()
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()

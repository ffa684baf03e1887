"""A steady vLLM decode load on this GPU, for measuring what another process on the same card gets.

    python3 benchmarks/device/vllm_load.py MODEL_DIR READY_FILE STOP_FILE OUT.json [--util 0.3]
        [--seqs 64] [--max-new 64] [--alone-s 10]

Generates ``--seqs`` chat prompts × ``--max-new`` tokens (temperature 1, end of sequence ignored,
so that every call is the same work) over and over, as the engine of a one-GPU run does. After
``--alone-s`` seconds of that it writes READY_FILE (the measurement beside it may start) and goes on
until STOP_FILE exists. OUT.json: tokens/s alone (before READY) and beside (after READY), each the
median of its calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("ready")
    ap.add_argument("stop")
    ap.add_argument("out")
    ap.add_argument("--util", type=float, default=0.3)
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--alone-s", type=float, default=10.0)
    args = ap.parse_args()
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {i} + {3 * i + 7}?"}],
                                       tokenize=False, add_generation_prompt=True)
               for i in range(args.seqs)]
    llm = LLM(model=args.model, gpu_memory_utilization=args.util, max_model_len=1024, seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=args.max_new, ignore_eos=True)
    rates = {"alone": [], "beside": []}
    t_start = time.perf_counter()
    ready = False
    while not Path(args.stop).exists():
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        rates["beside" if ready else "alone"].append(tokens / dt)
        if not ready and time.perf_counter() - t_start >= args.alone_s:
            Path(args.ready).write_text("ready\n")
            ready = True
    result = {k: {"calls": len(v), "median_tokens_per_s": statistics.median(v) if v else None}
              for k, v in rates.items()}
    result.update(seqs=args.seqs, max_new=args.max_new, util=args.util)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

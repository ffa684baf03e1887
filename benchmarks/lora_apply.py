"""How the embedded (hf) engine should apply a LoRA adapter: merge it into the weights at each update,
or keep the base weights and run the adapter beside them (peft's LoRA layers) at every forward.

    python benchmarks/lora_apply.py [--rank 16] [--seqs 16] [--new 32] [--repeats 3] [--threads 1]

On the default model (SmolLM2-135M, bf16, as the CPU rollout worker runs it) it prints, for a random
rank-r adapter on every attention and MLP projection:
  * merge: seconds per update of W = W0 + (alpha/r)·B·A written into every targeted weight (what
    ``engines/adapter.MergedAdapter`` does, ``engine_merge``), and the extra memory (the kept W0);
  * wrap: seconds per update of copying A and B into peft's LoRA layers (nothing else changes);
  * decode tokens/s of ``generate`` (``seqs`` prompts × ``new`` tokens, greedy) of the plain model
    (what the merged engine runs) and of the peft-wrapped one;
and the break-even: decoded tokens per update above which merging costs less than wrapping.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from areal_cli import lora  # noqa: E402
from areal_cli.config.schema import LoraConfig  # noqa: E402
from areal_cli.engines.adapter import engine_merge  # noqa: E402
from areal_cli.model_source import resolve_model  # noqa: E402


def decode_tps(model, prompts: torch.Tensor, new: int, repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=0)
        best = max(best, prompts.shape[0] * new / (time.perf_counter() - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM

    path, lo = resolve_model("smollm2-135m-instruct"), LoraConfig(rank=a.rank)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    layers = lora.target_layers(model, lo)
    torch.manual_seed(0)
    adapter = {s.name: torch.randn(s.shape) * 0.01 for s in lora.adapter_specs(model, lo)}
    base = {n: m.weight.detach().clone() for n, m in layers}
    merge_s = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        with torch.no_grad():
            for n, m in layers:
                m.weight.copy_(engine_merge(base[n], adapter[f"{n}.lora_A.weight"], adapter[f"{n}.lora_B.weight"],
                                            lora.scale(lo)))
        merge_s.append(time.perf_counter() - t0)
    extra = sum(w.numel() * w.element_size() for w in base.values())
    prompts = torch.randint(100, 40000, (a.seqs, 40), generator=torch.Generator().manual_seed(0))
    plain_tps = decode_tps(model, prompts, a.new, a.repeats)

    wrapped = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    wrapped = lora.inject(wrapped, lo)
    params = dict(lora.adapter_items(iter(wrapped.named_parameters())))
    copy_s = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(adapter[n])
        copy_s.append(time.perf_counter() - t0)
    wrap_tps = decode_tps(wrapped, prompts, a.new, a.repeats)
    merge, copy = min(merge_s), min(copy_s)
    per_token = 1 / wrap_tps - 1 / plain_tps  # seconds the adapter layers add to every decoded token
    print(f"rank {a.rank}, {len(layers)} layers, {a.threads} thread(s)")
    print(f"merge: {merge * 1000:.0f} ms per update; kept W0 {extra / 2**20:.0f} MiB")
    print(f"wrap:  {copy * 1000:.1f} ms per update")
    print(f"decode: plain (merged) {plain_tps:.1f} tokens/s, peft-wrapped {wrap_tps:.1f} tokens/s "
          f"({100 * (plain_tps / wrap_tps - 1):+.0f}% time per token)")
    if per_token > 0:
        print(f"break-even: merging costs less when more than {(merge - copy) / per_token:.0f} tokens are "
              "decoded between two updates")
    else:
        print("break-even: the wrapped model decoded no slower; wrapping costs less")


if __name__ == "__main__":
    main()

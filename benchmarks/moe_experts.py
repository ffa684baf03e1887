"""The experts of one mixture-of-experts layer, forward + backward, by implementation, on this
machine (the CPU unless ``--device cuda``).

    python -m benchmarks.moe_experts [--tokens 1024] [--hidden 512] [--inter 256] [--experts 16]
                                     [--top-k 4] [--dtype float32] [--reps 5]

transformers' experts module of the Qwen3-MoE layout (3D ``gate_up_proj`` / ``down_proj``
parameters) through each of its ``experts_implementation`` choices:

* ``eager``: the modelling code's own loop over the experts hit (one pair of matmuls per expert);
* ``batched_mm``: each (token, expert) pair gathers its expert's weights and runs one ``bmm``
  (memory grows with tokens × top-k × the expert's weights);
* ``grouped_mm``: the pairs sorted by expert, then torch's grouped matmul
  (``torch.nn.functional.grouped_mm`` / ``torch._grouped_mm``) over per-expert offsets.

Each: the median of ``--reps`` timed forward + backward passes after 2 warm-ups, and the largest
|difference| of the output and of the input's gradient from ``eager``'s. The trainer uses the
fastest (``areal_cli/moe.py`` ``EXPERTS_IMPLEMENTATION``); BENCHMARKS.md holds the figures.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm")


def experts_module(hidden: int, inter: int, experts: int, impl: str, device: str, dtype):
    """transformers' Qwen3-MoE experts with ``impl`` as its experts implementation, seeded."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts)
    cfg._experts_implementation = impl
    torch.manual_seed(0)
    m = Qwen3MoeExperts(cfg).to(device=device, dtype=dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, hidden ** -0.5)
    return m


def routing(tokens: int, hidden: int, experts: int, top_k: int, device: str, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, hidden, generator=g).to(device=device, dtype=dtype)
    probs = torch.randn(tokens, experts, generator=g).softmax(-1)
    weights, index = probs.topk(top_k, -1)
    return x, index.to(device), (weights / weights.sum(-1, keepdim=True)).to(device=device,
                                                                              dtype=dtype)


def run(m, x, index, weights):
    x = x.detach().requires_grad_(True)
    m.zero_grad(set_to_none=True)
    out = m(x, index, weights)
    out.square().sum().backward()
    return out.detach(), x.grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    x, index, weights = routing(a.tokens, a.hidden, a.experts, a.top_k, a.device, dtype)
    print(f"torch {torch.__version__}, {a.device}, {a.dtype}: {a.tokens} tokens, hidden "
          f"{a.hidden}, expert inner {a.inter}, {a.experts} experts, top-{a.top_k}")
    ref = None
    for impl in IMPLEMENTATIONS:
        m = experts_module(a.hidden, a.inter, a.experts, impl, a.device, dtype)
        for _ in range(2):
            out, gx = run(m, x, index, weights)
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            out, gx = run(m, x, index, weights)
            if a.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        ref = ref or (out, gx)
        diff = max(float((out - ref[0]).abs().max()), float((gx - ref[1]).abs().max()))
        print(f"{impl:>11}: {1e3 * statistics.median(times):8.1f} ms forward + backward  "
              f"(max |diff| from eager {diff:.1e})")


if __name__ == "__main__":
    main()

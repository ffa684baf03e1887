"""Causal attention forward + backward of the trainer's long sequences, by kernel, on one GPU.

    python3 -m benchmarks.attention_kernels [--seqs 2] [--length 8256] [--reps 10] [--json FILE]

For the attention shapes of the Qwen2.5-1.5B and -7B layouts (query heads, key/value heads, head
size 128), ``--seqs`` sequences of ``--length`` tokens (bf16, random values) through:

* ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` over the sequences flattened end to end with
  cumulative offsets (what the trainer runs for packed micro-batches, ``trainer/varlen.py``);
* ``sdpa_flash``, ``sdpa_cudnn``, ``sdpa_efficient``:
  ``scaled_dot_product_attention(is_causal=True)`` on a [seqs, heads, length, 128] batch, one
  backend each (the key/value heads repeated where the backend refuses grouped queries).

Each: the median time of forward + backward over ``--reps`` after 3 warm-ups, the causal TFLOP/s
(4 · heads · 128 · length² / 2 a sequence forward, 2.5× that backward), and the largest |difference|
of the output and of the query's gradient from ``varlen``'s. A backend that refuses the shapes says
why.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

LAYOUTS = {"qwen2.5-1.5b": (12, 2), "qwen2.5-7b": (28, 4)}
"""Layout → (query heads, key/value heads); head size 128 in both."""
HEAD = 128


def inputs(seqs: int, length: int, hq: int, hkv: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(seqs, hq, length, HEAD, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(seqs, hkv, length, HEAD, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(seqs, hkv, length, HEAD, device="cuda", dtype=torch.bfloat16, generator=g)
    grad = torch.randn(seqs, hq, length, HEAD, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v, grad


def run_varlen(q, k, v):
    from torch.nn.attention.varlen import varlen_attn

    from areal_cli.trainer.varlen import _causal_kwargs

    b, hq, t, d = q.shape
    hkv = k.shape[1]
    cu = torch.arange(0, (b + 1) * t, t, device=q.device, dtype=torch.int32)
    kw = dict(_causal_kwargs(varlen_attn, None, gqa=hkv != hq))
    if hkv != hq and "enable_gqa" not in kw:
        k, v = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v))
        hkv = hq
    flat = [x.transpose(1, 2).reshape(b * t, x.shape[1], d) for x in (q, k, v)]
    out = varlen_attn(*flat, cu, cu, t, t, **kw)
    return out.reshape(b, t, hq, d).transpose(1, 2)


def sdpa(backend):
    def run(q, k, v):
        with sdpa_kernel([backend]):
            try:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                      enable_gqa=k.shape[1] != q.shape[1])
            except RuntimeError:
                rep = q.shape[1] // k.shape[1]
                k2, v2 = (x.repeat_interleave(rep, dim=1) for x in (k, v))
                return F.scaled_dot_product_attention(q, k2, v2, is_causal=True)
    return run


KERNELS = {"varlen": run_varlen, "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
           "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
           "sdpa_efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION)}


def measure(fn, q, k, v, grad, reps: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(median seconds of forward + backward, the output, the query's gradient)."""
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    times = []
    for i in range(3 + reps):
        for x in (q, k, v):
            x.grad = None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(q, k, v)
        out.backward(grad)
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out.detach(), q.grad.detach()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--length", type=int, default=8256)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    result = {"machine": torch.cuda.get_device_name(), "torch": torch.__version__,
              "seqs": args.seqs,
              "length": args.length, "layouts": {}}
    print(f"{result['machine']}, torch {torch.__version__}, {args.seqs} x {args.length} tokens, "
          "bf16, causal", flush=True)
    for layout, (hq, hkv) in LAYOUTS.items():
        q, k, v, grad = inputs(args.seqs, args.length, hq, hkv)
        flops = args.seqs * 4 * hq * HEAD * args.length ** 2 / 2 * 3.5  # forward + 2.5x backward
        rows, ref = {}, None
        for name, fn in KERNELS.items():
            try:
                s, out, gq = measure(fn, q, k, v, grad, args.reps)
            except RuntimeError as e:  # a backend that refuses these shapes
                rows[name] = {"error": str(e).splitlines()[0][:200]}
                print(f"  {layout:13} {name:15} refused: {rows[name]['error']}", flush=True)
                continue
            if ref is None:
                ref = (out, gq)
            rows[name] = {"s": s, "tflops": flops / s / 1e12,
                          "out_max_abs_diff": float((out.float() - ref[0].float()).abs().max()),
                          "grad_q_max_abs_diff": float((gq.float() - ref[1].float()).abs().max())}
            r = rows[name]
            print(f"  {layout:13} {name:15} {1e3 * s:8.2f} ms  {r['tflops']:6.1f} TFLOP/s  |out - "
                  f"varlen| {r['out_max_abs_diff']:.1e}  |dq - varlen| "
                  f"{r['grad_q_max_abs_diff']:.1e}", flush=True)
            del out, gq
        result["layouts"][layout] = rows
        del q, k, v, grad
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

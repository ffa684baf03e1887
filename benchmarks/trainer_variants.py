"""The trainer step on one GPU with each packed-attention and output-layer variant, on random
weights of a real architecture (label every figure "random weights").

    python3 benchmarks/trainer_variants.py [--arch qwen2.5-1.5b-instruct] [--seqs 8] [--length 8192] \
        [--micro-batch-tokens 16384] [--steps 2] [--profile-dir DIR] [--json FILE]

Variants, all with packing, activation checkpointing and the float32 output layer that
``engine=vllm`` runs use (``engine.lm_head_fp32``):

* attention: ``varlen`` (``trainer.varlen=true``, FlashAttention over each sequence) or ``mask``
  (SDPA with the dense block-diagonal mask);
* output layer: ``half`` (one bf16 GEMM with a float32 output) or ``float32`` (the inputs cast
  to float32, a float32 GEMM).

For each: the median step time over ``--steps`` steps after one warm-up, the step's MFU (model
FLOPs, as the trainer reports it), peak GPU memory; and the logprobs of the first sequence at the
initial weights against a float32 forward of the same weights (float32 SDPA, no autocast): max
and mean |difference|, so that a kernel's bf16 rounding and a wrong result can be told apart. One
rank (FSDP2 on a one-rank NCCL group), the real ``StepRunner`` (GRPO loss, AdamW), a batch of
``--seqs`` sequences of a 64-token prompt and a ``--length``-token response (random ids).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import areal_cli.trainer.model as policy_model
from areal_cli.config.resolve import Placement
from areal_cli.runconfig.autos import resolve
from areal_cli.runconfig.compose import compose
from areal_cli.trainer.batching import PACKED_ROW_TOKENS_CUDA, from_batch, model_inputs
from areal_cli.trainer.logprobs import forward_logprobs
from areal_cli.trainer.step import StepRunner
from areal_cli.transport.messages import Batch, GroupResult, Sample

ARCHS = Path(__file__).resolve().parent / "models"


def checkpoint(arch: str) -> Path:
    """Random bf16 weights of ``arch`` (benchmarks/models/ARCH/config.json), saved once under /tmp."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(tempfile.gettempdir()) / f"areal_random_{arch}"
    if not (out / "config.json").is_file():
        cfg = AutoConfig.from_pretrained(ARCHS / arch)
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(out)
        del model
        torch.cuda.empty_cache()
    return out


def batch(seqs: int, length: int, ragged: bool = False) -> Batch:
    """``seqs`` sequences in groups of 2 (rewards 0 and 1) of a 64-token prompt and a ``length``-token response
    of random ids; ``ragged``: prompts of 32-256 tokens and responses of ``length / 2``-``length`` instead, as
    a real batch has (packed rows then end in padding)."""
    rng = np.random.default_rng(0)
    groups = []
    for g in range(seqs // 2):
        prompt = rng.integers(100, 10000, int(rng.integers(32, 257)) if ragged else 64).astype(np.int32)
        lens = [int(rng.integers(length // 2, length + 1)) if ragged else length for _ in range(2)]
        samples = [Sample(sample_index=i, prompt_ids=prompt, output_ids=rng.integers(100, 10000, n).astype(np.int32),
                          logprobs=np.full(n, -2.0, np.float32), versions=np.zeros(n, np.int32),
                          loss_mask=np.ones(n, np.uint8), reward=float(i), reward_status="ok",
                          finish_reason="length", num_turns=1, completion="") for i, n in enumerate(lens)]
        groups.append(GroupResult(group_id=g, prompt_id=f"p{g}", worker=0, samples=samples, gen_time_s=0.0,
                                  gen_tokens=0))
    return Batch(step=0, groups=groups)


def reference_logprobs(path: Path, b: Batch, device) -> torch.Tensor:
    """The first sequence's response logprobs from a float32 forward (float32 SDPA, no autocast)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").to(device)
    x = model_inputs(from_batch(b), [0], False, device=device)
    with torch.no_grad():
        lp, _ = forward_logprobs(model, x, torch.float32, 1.0, 256)
    del model
    torch.cuda.empty_cache()
    return lp[0].cpu()


def run(args, path: Path, attention: str, head: str, b: Batch, device) -> dict:
    cfg = compose(["trainer.packing=true", "trainer.activation_checkpointing=true", "engine.lm_head_fp32=true",
                   f"trainer.varlen={attention == 'varlen'}", f"trainer.micro_batch_tokens={args.micro_batch_tokens}",
                   "rollout.group_size=2", f"rollout.max_new_tokens={args.length}"])
    cfg = resolve(cfg, Placement(trainer_gpu=True))
    saved = policy_model.half_gemm_float32_out
    if head == "float32":
        policy_model.half_gemm_float32_out = lambda x, w: False
    try:
        model = policy_model.build_policy(path, device, torch.bfloat16, True, fp32_head=True,
                                          varlen=attention == "varlen")
        runner = StepRunner(model, cfg, device, torch.bfloat16, rank=0, world=1)
        ro = from_batch(b)
        x = model_inputs(ro, [0], True, device=device, row_tokens=PACKED_ROW_TOKENS_CUDA, varlen=runner.varlen)
        with torch.no_grad():
            lp, _ = forward_logprobs(model, x, torch.bfloat16, 1.0, cfg.trainer.logprob_chunk_tokens)
        times, metrics = [], {}
        for _ in range(args.steps + 1):
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            metrics = runner.train(b)
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        out = {"attention": attention, "head": head, "varlen_used": runner.varlen,
               "half_head_used": head == "half" and policy_model.MM_FLOAT32_OUT,
               "step_s": statistics.median(times[1:]), "step_s_all": times, "mfu": metrics.get("mfu"),
               "model_tflops_per_s": metrics.get("model_tflops_per_s"),
               "peak_gpu_GiB": torch.cuda.max_memory_allocated(device) / 2**30, "logprobs": lp[0].float().cpu()}
        if args.profile_dir:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                runner.train(b)
                torch.cuda.synchronize(device)
            os.makedirs(args.profile_dir, exist_ok=True)
            Path(args.profile_dir, f"profile_{attention}_{head}.txt").write_text(
                prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
        del runner, model
        return out
    finally:
        policy_model.half_gemm_float32_out = saved
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen2.5-1.5b-instruct")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["varlen/half", "mask/half", "varlen/float32", "mask/float32"])
    ap.add_argument("--profile-dir")
    ap.add_argument("--json")
    args = ap.parse_args()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    path = checkpoint(args.arch)
    b = batch(args.seqs, args.length)
    print(f"machine: {torch.cuda.get_device_name()} (torch {torch.__version__}); {args.arch}, random weights; "
          f"{args.seqs} x (64 + {args.length}) tokens, micro_batch_tokens {args.micro_batch_tokens}", flush=True)
    ref = reference_logprobs(path, b, device)
    results = []
    for v in args.variants:
        attention, head = v.split("/")
        try:
            r = run(args, path, attention, head, b, device)
        except Exception as e:  # e.g. out of memory: report and go on
            print(f"{v:16} failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
            results.append({"variant": v, "error": f"{type(e).__name__}: {e}"})
            continue
        diff = (r.pop("logprobs") - ref).abs()
        r.update(variant=v, logprob_max_abs_diff=float(diff.max()), logprob_mean_abs_diff=float(diff.mean()))
        results.append(r)
        print(f"{v:16} step {r['step_s']:7.3f} s  MFU {100 * (r['mfu'] or 0):5.1f}%  peak {r['peak_gpu_GiB']:5.1f} GiB  "
              f"varlen {r['varlen_used']}  half head {r['half_head_used']}  logprobs vs float32: "
              f"max {r['logprob_max_abs_diff']:.2e} mean {r['logprob_mean_abs_diff']:.2e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": torch.cuda.get_device_name(), "torch": torch.__version__,
                                               "date": time.strftime("%Y-%m-%d"), "args": vars(args),
                                               "weights": "random", "results": results}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    from areal_cli.runtime import run_main

    run_main(main)

"""Trainer throughput with and without sequence packing on one synthetic batch.

    .venv/bin/python benchmarks/packing.py [--model smollm2-135m-instruct] [--seqs 32]
    python3 benchmarks/packing.py --model random-135m --seqs 256 --group 8 \
        --micro-batch-tokens 16384 --packed-rows 16384 4096 2048 --phases --profile-dir DIR   # GPU

One trainer rank (FSDP2 on a one-rank gloo/nccl group), the real ``StepRunner`` step (GRPO
loss, AdamW), the same batch for both layouts: prompts and responses of uneven lengths, as
a real batch has. Prints the machine, then tokens/s (prompt + response tokens, and the
trained response tokens) of each layout, median over the timed steps after one warm-up.

``--model random-135m`` uses SmolLM2-135M's shape with random weights (no files needed).
On GPU, ``--packed-rows`` lists the longest packed rows to try (``PACKED_ROW_TOKENS_CUDA``),
``--host-mask`` adds the packed layout with its mask built on the host (the code before the
fix), ``--phases`` times one more step with a sync around each phase (inputs, forward with the
chunked log-softmax, loss, backward, clip + AdamW), and ``--profile-dir`` writes a torch.profiler table of one
step per layout. ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist

from areal_cli.config.resolve import Placement
from areal_cli.model_source import resolve_model
from areal_cli.runconfig.autos import resolve
from areal_cli.runconfig.compose import compose
from areal_cli.trainer.model import build_policy
from areal_cli.trainer.step import StepRunner
from areal_cli.transport.messages import Batch, GroupResult, Sample


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line)
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {torch.get_num_threads()} torch threads (torch {torch.__version__})"


def synthetic_batch(seqs: int, group: int, prompt: tuple[int, int], resp: tuple[int, int], seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(seqs // group):
        p = rng.integers(100, 10000, rng.integers(*prompt)).astype(np.int32)
        samples = []
        for i in range(group):
            r = rng.integers(100, 10000, rng.integers(*resp)).astype(np.int32)
            samples.append(Sample(sample_index=i, prompt_ids=p, output_ids=r,
                                  logprobs=np.full(len(r), -2.0, np.float32), versions=np.zeros(len(r), np.int32),
                                  loss_mask=np.ones(len(r), np.uint8), reward=float(i % 2), reward_status="ok",
                                  finish_reason="stop", num_turns=1, completion=""))
        groups.append(GroupResult(group_id=g, prompt_id=f"p{g}", worker=0, samples=samples, gen_time_s=0.0,
                                  gen_tokens=0))
    return Batch(step=0, groups=groups)


def model_path(name: str):
    if name != "random-135m":
        return resolve_model(name)
    from transformers import LlamaConfig, LlamaForCausalLM

    d = os.path.join(tempfile.gettempdir(), "areal_random_135m")
    if not os.path.exists(os.path.join(d, "config.json")):
        cfg = LlamaConfig(hidden_size=576, num_hidden_layers=30, intermediate_size=1536, num_attention_heads=9,
                          num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                          max_position_embeddings=8192, rope_theta=100000.0)
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).save_pretrained(d)
    return d


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def phase_timers(device, into: dict):
    """Sync-and-time the phases of ``StepRunner.train`` by wrapping what step.py calls."""
    import areal_cli.trainer.step as step

    def timed(key, fn):
        def wrapper(*a, **k):
            _sync(device)
            t0 = time.perf_counter()
            out = fn(*a, **k)
            _sync(device)
            into[key] = into.get(key, 0.0) + time.perf_counter() - t0
            return out
        return wrapper

    saved = {n: getattr(step, n) for n in ("model_inputs", "forward_logprobs", "policy_loss")}
    clip = torch.nn.utils.clip_grad_norm_
    for n, f in saved.items():
        setattr(step, n, timed({"model_inputs": "inputs_s", "forward_logprobs": "forward_s",
                                "policy_loss": "loss_s"}[n], f))
    torch.nn.utils.clip_grad_norm_ = timed("clip_s", clip)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(step, n, f)
        torch.nn.utils.clip_grad_norm_ = clip


def measure(args, packing: bool, device: torch.device, batch: Batch, label: str, packed_row: int | None = None,
            host_mask: bool = False) -> dict:
    import areal_cli.trainer.batching as batching
    import areal_cli.trainer.step as step

    cfg = compose([f"trainer.packing={packing}", f"trainer.micro_batch_tokens={args.micro_batch_tokens}",
                   f"rollout.group_size={args.group}", f"rollout.max_new_tokens={args.response[1]}"])
    cfg = resolve(cfg, Placement(trainer_gpu=device.type == "cuda"))
    dtype = torch.bfloat16
    torch.manual_seed(0)
    saved_row, saved_inputs = batching.PACKED_ROW_TOKENS_CUDA, step.model_inputs
    if packed_row:
        batching.PACKED_ROW_TOKENS_CUDA = packed_row
    if host_mask:  # the mask built on the host and copied over, as before
        step.model_inputs = (lambda ro, mb, packed, pad=0, device=None, row_tokens=None, buckets=0, varlen=False:
                             saved_inputs(ro, mb, packed, pad, row_tokens=row_tokens, buckets=buckets).to(device))
    try:
        model = build_policy(model_path(args.model), device, dtype, activation_checkpointing=False)
        runner = StepRunner(model, cfg, device, dtype, rank=0, world=1)
        times, out = [], {}
        for _ in range(args.steps + 1):
            t0 = time.perf_counter()
            res = runner.train(batch)
            _sync(device)
            times.append(time.perf_counter() - t0)
        out = {"label": label, "packing": packing, "step_s": statistics.median(times[1:]),
               "step_s_all": times, "micro_batches": res["micro_batches"]}
        if device.type == "cuda":
            out["max_mem_GiB"] = torch.cuda.max_memory_allocated(device) / 2**30
        if args.phases:
            ph: dict = {}
            _sync(device)
            t0 = time.perf_counter()
            with phase_timers(device, ph):
                orig = runner.opt.step

                def opt_step(*a, **k):
                    _sync(device)
                    s0 = time.perf_counter()
                    r = orig(*a, **k)
                    _sync(device)
                    ph["adamw_s"] = ph.get("adamw_s", 0.0) + time.perf_counter() - s0
                    return r
                runner.opt.step = opt_step
                runner.train(batch)
                runner.opt.step = orig
            _sync(device)
            ph["step_s"] = time.perf_counter() - t0
            ph["backward_and_rest_s"] = ph["step_s"] - sum(v for k, v in ph.items() if k != "step_s")
            out["phases"] = ph
        if args.profile_dir and device.type == "cuda":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                runner.train(batch)
                _sync(device)
            os.makedirs(args.profile_dir, exist_ok=True)
            with open(os.path.join(args.profile_dir, f"profile_{label}.txt"), "w") as f:
                f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30))
        del runner, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        return out
    finally:
        batching.PACKED_ROW_TOKENS_CUDA, step.model_inputs = saved_row, saved_inputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt", type=int, nargs=2, default=(40, 120), metavar=("MIN", "MAX"))
    ap.add_argument("--response", type=int, nargs=2, default=(8, 128), metavar=("MIN", "MAX"))
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--packed-rows", type=int, nargs="*", default=[],
                    help="GPU: longest packed rows to try (PACKED_ROW_TOKENS_CUDA); none = the default")
    ap.add_argument("--host-mask", action="store_true", help="also: packed, mask built on the host (before the fix)")
    ap.add_argument("--phases", action="store_true")
    ap.add_argument("--profile-dir")
    ap.add_argument("--json")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    batch = synthetic_batch(args.seqs, args.group, tuple(args.prompt), tuple(args.response), seed=0)
    samples = [s for g in batch.groups for s in g.samples]
    total = sum(len(s.prompt_ids) + len(s.output_ids) for s in samples)
    trained = sum(len(s.output_ids) for s in samples)
    print(f"machine: {machine(device)}")
    print(f"batch: {len(samples)} sequences, {total} tokens ({trained} response), model {args.model}, "
          f"micro_batch_tokens {args.micro_batch_tokens}, bf16 autocast")
    runs = [("padded", False, None, False)]
    rows = args.packed_rows if device.type == "cuda" and args.packed_rows else [None]
    runs += [(f"packed_{r or 'default'}", True, r, False) for r in rows]
    if args.host_mask and device.type == "cuda":
        runs.append((f"packed_{rows[0] or 'default'}_hostmask", True, rows[0], True))
    results = []
    for label, packing, row, host in runs:
        try:
            r = measure(args, packing, device, batch, label, row, host)
        except Exception as e:  # e.g. out of memory for a long packed row: report and go on
            print(f"{label:24} failed: {type(e).__name__}: {str(e)[:300]}")
            results.append({"label": label, "error": f"{type(e).__name__}: {e}"})
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        s = r["step_s"]
        r.update(tokens_per_s=total / s, response_tokens_per_s=trained / s)
        results.append(r)
        print(f"{label:24} packing={str(packing).lower():5} {s:7.3f} s/step  {total / s:8.0f} tokens/s  "
              f"{trained / s:8.0f} response tokens/s  micro-batches {r['micro_batches']}"
              + (f"  peak {r['max_mem_GiB']:.1f} GiB" if "max_mem_GiB" in r else ""))
        if "phases" in r:
            print("    phases (synced): " + "  ".join(f"{k} {v:.3f}" for k, v in r["phases"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(device), "date": time.strftime("%Y-%m-%d"), "sequences": len(samples),
                       "tokens": total, "response_tokens": trained, "args": vars(args), "results": results}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    from areal_cli.runtime import run_main

    run_main(main)

"""Where the trainer step's time goes, and what each speed lever does to it: N steps of the real
``StepRunner`` on random weights of a real architecture (label every figure "random weights").

    python3 benchmarks/trainer_profile.py [--arch qwen2.5-1.5b-instruct] [--seqs 8] [--length 8192]
    \
        [--steps 3] [--rows baseline compile no_ckpt+compile+chunk2048 ...] [--profile baseline] \
        [--out DIR] [override ...]
    torchrun --nproc-per-node 4 benchmarks/trainer_profile.py --arch qwen2.5-7b-instruct --seqs 12
    ...

Each row is the baseline config (packing, varlen attention, activation checkpointing of every layer,
the float32 output layer of ``engine=vllm`` runs, ``micro_batch_tokens`` 16384, GRPO loss, fused
AdamW, ``logprob_chunk_tokens`` 256) with the row's levers (``LEVERS``), then the trailing
``override``s. For each row: the
median step time over ``--steps`` steps after one warm-up step (which compiles, where the row
compiles), the MFU the trainer reports, the peak GPU memory and the median of each part of the
step-time breakdown (``time/<part>_s``, ``trainer/timing.py``), and the largest |difference| of the
first sequence's logprobs at the initial weights from the first row's. A row that runs out of memory
is reported as such. ``--profile ROW``: one more step of that row under the torch profiler, written
to DIR as a Chrome trace (``trace_ROW.json.gz``) and a table of the top kernels by GPU time
(``kernels_ROW.txt``), whose NCCL kernels are the FSDP collectives. Batch: ``--seqs`` sequences of
a 64-token prompt and a ``--length``-token response (random ids, two rewards per group), split
over the ranks as the trainer splits it; ``--batch FILE``: a batch the trainer kept for a step whose
gradient norm was not finite (``RUN_DIR/nonfinite/``), replayed with its own tokens, logprobs and
rewards (``--arch`` then names the run's model directory); ``--grad-probe``: where the first step's
gradient grows, layer by layer (``benchmarks/grad_probe.py``). Results: DIR/results.json and a table
on stdout.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import re
import shutil
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from areal_cli.config.resolve import Placement
from areal_cli.runconfig.autos import resolve
from areal_cli.runconfig.compose import compose
from areal_cli.trainer.batching import from_batch, shard
from areal_cli.trainer.model import build_policy, policy_options
from areal_cli.trainer.step import StepRunner
from benchmarks.grad_probe import GradProbe, print_report
from benchmarks.trainer_variants import batch, checkpoint

BASELINE = ["trainer.packing=true", "trainer.varlen=true", "trainer.activation_checkpointing=true",
            "engine.lm_head_fp32=true", "trainer.micro_batch_tokens=16384", "trainer.compile=false",
            "trainer.logprob_chunk_tokens=256",
            "trainer.skip_zero_advantage=false", "rollout.group_size=2"]
"""Every row starts from these (the trainer of the 1.5B/7B size runs before these levers)."""

LEVERS = {
    "baseline": [],
    "every2": ["trainer.checkpoint_every=2"],
    "no_ckpt": ["trainer.activation_checkpointing=false"],
    "compile": ["trainer.compile=true"],
    "no_reshard": ["trainer.reshard_after_forward=false"],
    "auto": ["trainer.compile=auto", "trainer.logprob_chunk_tokens=0"],
    "lora16": ["trainer.lora.rank=16"],
    "anomaly": ["trainer.detect_anomaly=true"],
    "entropy": ["algorithm.entropy_coef=1.0", "trainer.lr=2e-4"],
}
"""Lever name → overrides on top of ``BASELINE``; also ``chunkN`` (``logprob_chunk_tokens=N``) and
``mbtN`` (``micro_batch_tokens=N``). ``lora16``, ``entropy`` and ``anomaly`` are not speed levers:
LoRA's step, a gradient that is not zero (the batch's rewards leave half the advantages 0; the
entropy bonus reaches every token), and the operation where a NaN gradient starts
(``trainer.detect_anomaly``), each row reporting its gradient norms. A row joins levers with ``+``
(``no_ckpt+compile+chunk2048``).
``auto``: what ``config/resolve.py`` picks for the trainer on a GPU."""


def row_overrides(row: str) -> list[str]:
    """The overrides of a row such as ``every2+compile+mbt32768``; ValueError for an unknown
    lever."""
    out = []
    for lever in row.split("+"):
        number = re.fullmatch(r"(chunk|mbt)(\d+)", lever)
        if number:
            key = "logprob_chunk_tokens" if number[1] == "chunk" else "micro_batch_tokens"
            out.append(f"trainer.{key}={number[2]}")
        elif lever in LEVERS:
            out += LEVERS[lever]
        else:
            raise ValueError(f"row {row!r}: unknown lever {lever!r}: use {', '.join(LEVERS)}, "
                             "chunkN or mbtN")
    return out


def kept_batch(path: str):
    """The ``Batch`` the trainer kept for a step with a non-finite gradient norm (its wire
    frame)."""
    from areal_cli.transport.messages import Batch, decode

    b = decode(Path(path).read_bytes(), (Batch,))
    b.step = 0
    return b


def init() -> tuple[int, int, torch.device]:
    """(rank, world, device): torchrun's group, else a one-rank group; NCCL on GPUs, gloo on the CPU
    (a smoke run: no MFU there)."""
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if not cuda:
        return dist.get_rank(), dist.get_world_size(), torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_row(name: str, overrides: list[str], args, path: Path, b, device, rank: int,
            world: int) -> dict:
    cfg = resolve(compose([*BASELINE, f"rollout.max_new_tokens={args.length}", *row_overrides(name),
                           *overrides]),
                  Placement(trainer_gpu=True, model_path=path))
    options = policy_options(cfg)
    t = cfg.trainer
    # JSON
    shown = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in options.items()}
    row = {"row": name, "options": shown, "micro_batch_tokens": t.micro_batch_tokens,
           "logprob_chunk_tokens": t.logprob_chunk_tokens}
    model = build_policy(path, device, torch.bfloat16, **options)
    runner = StepRunner(model, cfg, device, torch.bfloat16, rank=rank, world=world)
    ro = from_batch(b)
    # the initial weights' logprobs of the first sequence: what each lever computes
    with torch.no_grad():
        # every rank runs the forward (FSDP's all-gathers are collectives); the rank that holds row
        # 0 keeps it
        first = runner._forward(ro, [0])[0][0].float().cpu()
        row["logprobs"] = first if 0 in shard(ro.n, rank, world) else None
    times, metrics = [], []
    probe = GradProbe(model) if args.grad_probe else None
    if probe:
        probe.arm()  # the first (warm-up) step
    for _ in range(args.steps + 1):
        sync(device)
        t0 = time.perf_counter()
        metrics.append(runner.train(b))
        times.append(time.perf_counter() - t0)
        if probe:
            row["grad_probe"] = probe.report()
            probe.remove()
            if rank == 0:
                print(f"{name}: gradient of each decoder layer's output, first micro-batch of rank "
                      f"0's first step (gradient norm {metrics[0].get('grad_norm')}):", flush=True)
                print_report(row["grad_probe"])
            probe = None
    measured = metrics[1:]
    parts = sorted({k for m in measured for k in m if k.startswith("time/")})
    row.update(step_s=statistics.median(times[1:]), step_s_all=times, warmup_s=times[0],
               mfu=statistics.median(m.get("mfu", 0.0) for m in measured),
               tflops_per_gpu=statistics.median(m["model_tflops_per_s"] for m in measured) / world,
               peak_gpu_mem_gb=max(m.get("peak_gpu_mem_gb", 0.0) for m in measured),
               grad_norms=[m.get("grad_norm") for m in metrics],
               breakdown={k[len("time/"):-len("_s")]: statistics.median(m.get(k, 0.0)
                                                                        for m in measured)
                          for k in parts})
    if name in args.profile:
        profile(name, runner, b, device, Path(args.out), rank)
    del runner, model
    return row


def profile(name: str, runner, b, device, out: Path, rank: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        runner.train(b)
        sync(device)
    if rank != 0:
        return
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=30,
                                      max_name_column_width=70)
    name = name.replace("+", "_")  # file names of letters, digits, '.', '_' and '-'
    (out / f"kernels_{name}.txt").write_text(table)
    raw = out / f"trace_{name}.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    print(f"profile of {name}: {out / f'kernels_{name}.txt'}, {raw}.gz", flush=True)


def free(device) -> None:
    import torch._dynamo

    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def print_row(r: dict) -> None:
    if "error" in r:
        print(f"{r['row']:12} {r['error']}", flush=True)
        return
    print(f"{r['row']}: {r['options']}, micro_batch_tokens {r['micro_batch_tokens']}, "
          f"logprob_chunk_tokens {r['logprob_chunk_tokens']}", flush=True)
    parts = "  ".join(f"{k} {v:.3f}" for k, v in r["breakdown"].items() if k != "step")
    print(f"{r['row']:12} step {r['step_s']:6.3f} s  MFU {100 * r['mfu']:5.1f}%  peak "
          f"{r['peak_gpu_mem_gb']:5.1f} GiB  (warm-up {r['warmup_s']:.1f} s, logprobs vs first row "
          f"{r.get('logprob_max_abs_diff_vs_first_row', 0):.1e}) | {parts} | grad norms "
          f"{', '.join(f'{g:.3g}' for g in r['grad_norms'])}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen2.5-1.5b-instruct")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--ragged", action="store_true",
                    help="prompts of 32-256 tokens and responses of length/2-length (padded rows, "
                         "as a real batch)")
    ap.add_argument("--batch", help="a batch kept by the trainer "
                                    "(RUN_DIR/nonfinite/batch_STEP.msgpack) instead of random ids: "
                                    "its tokens, logprobs and rewards (--seqs, --length, --ragged "
                                    "unused)")
    ap.add_argument("--grad-probe", action="store_true",
                    help="each decoder layer's largest output gradient in the first step, the "
                         "token where it sits and its hidden-state RMS (benchmarks/grad_probe.py)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rows", nargs="+",
                    default=["baseline", "every2", "no_ckpt", "compile", "no_reshard", "chunk1024",
                                                  "mbt32768", "auto"],
                    help="levers joined by +, e.g. no_ckpt+compile")
    ap.add_argument("--profile", nargs="*", default=["baseline"],
                    help="rows to profile one more step of")
    ap.add_argument("--out", default="trainer_profile")
    ap.add_argument("overrides", nargs="*", help="config overrides for every row")
    args = ap.parse_args()
    rank, world, device = init()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if Path(args.arch, "config.json").is_file():  # a checkpoint's directory
        path = Path(args.arch)
    else:  # random weights of benchmarks/models/ARCH, built once by rank 0
        if rank == 0:
            checkpoint(args.arch)
        dist.barrier()
        path = checkpoint(args.arch)
    b = kept_batch(args.batch) if args.batch else batch(args.seqs, args.length, args.ragged)
    if args.batch:  # its longest response is the rows' max_new_tokens
        args.length = max(len(s.output_ids) for g in b.groups for s in g.samples)
    head = {"machine": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            "gpus": world, "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "arch": args.arch,
            "weights": "of the directory" if Path(args.arch, "config.json").is_file() else "random",
            "batch": args.batch or f"{args.seqs} x (64 + {args.length}) tokens"
            + (", ragged" if args.ragged else ""),
            "baseline": BASELINE, "overrides": args.overrides}
    if rank == 0:
        print(json.dumps(head), flush=True)
    rows, base = [], None
    for name in args.rows:
        try:
            rows.append(run_row(name, args.overrides, args, path, b, device, rank, world))
        except torch.cuda.OutOfMemoryError as e:
            rows.append({"row": name, "error": f"out of memory: {str(e)[:200]}"})
        # trainer.detect_anomaly's named operation; the next row still runs
        except RuntimeError as e:
            if "trainer.detect_anomaly" not in str(e):
                raise
            rows.append({"row": name, "error": str(e)[:400]})
        lp = rows[-1].pop("logprobs", None)
        # each row's logprobs against the first row's (bf16 rounding differs, values do not)
        if lp is not None:
            base = lp if base is None else base
            rows[-1]["logprob_max_abs_diff_vs_first_row"] = float((lp - base).abs().max())
        free(device)
        if rank == 0:
            print_row(rows[-1])
            Path(args.out, "results.json").write_text(json.dumps({**head, "rows": rows}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    from areal_cli.runtime import run_main

    run_main(main)

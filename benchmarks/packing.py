"""Trainer throughput with and without sequence packing on one synthetic batch.

    .venv/bin/python benchmarks/packing.py [--model smollm2-135m-instruct] [--seqs 32]

One trainer rank (FSDP2 on a one-rank gloo/nccl group), the real ``StepRunner`` step (GRPO
loss, AdamW), the same batch for both layouts: prompts and responses of uneven lengths, as
a real batch has. Prints the machine, then tokens/s (prompt + response tokens, and the
trained response tokens) of each layout, median over the timed steps after one warm-up.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from areal_cli.config.load import compose
from areal_cli.models import resolve_model
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
    return Batch(step=0, trained_version=0, groups=groups)


def measure(args, packing: bool, device: torch.device, batch: Batch) -> float:
    cfg = compose([f"trainer.packing={packing}", f"trainer.micro_batch_tokens={args.micro_batch_tokens}",
                   f"rollout.group_size={args.group}", f"rollout.max_new_tokens={args.response[1]}"])
    dtype = torch.bfloat16
    torch.manual_seed(0)
    model = build_policy(resolve_model(args.model), device, dtype, activation_checkpointing=False)
    runner = StepRunner(model, cfg, device, dtype, rank=0, world=1)
    times = []
    for _ in range(args.steps + 1):
        t0 = time.perf_counter()
        runner.train(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt", type=int, nargs=2, default=(40, 120), metavar=("MIN", "MAX"))
    ap.add_argument("--response", type=int, nargs=2, default=(8, 128), metavar=("MIN", "MAX"))
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
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
    for packing in (True, False):
        s = measure(args, packing, device, batch)
        print(f"packing={str(packing).lower():5}  {s:7.2f} s/step  {total / s:8.0f} tokens/s  "
              f"{trained / s:8.0f} response tokens/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Whether the trainer's steps still compile after ``trainer/precompile.py``: the real ``StepRunner`` on
random weights of a real architecture (label every figure "random weights"), with compiled layers,
precompiled as ``areal train`` does before its first batch (``--no-precompile``: not), then ``--steps``
batches whose response lengths are drawn from a length profile (``arithmetic_long``: a long tail up to
``--max-new-tokens``), different lengths every step, as a run gets them.

    python3 -m benchmarks.precompile_check [--arch qwen2.5-1.5b-instruct] [--steps 16] [--groups 8] \
        [--group-size 8] [--max-new-tokens 2048] [--no-precompile] [--json FILE] [override ...]

Prints the forms precompiled and the seconds it took, then one line a step: the tokens of its batch, the
graphs dynamo compiled during it (``compiled_graphs``, as in metrics.jsonl) and its time; then the
steps that compiled and the slowest step against the median. With ``algorithm.kl_coef`` > 0 each line
also has ``kl_ref``, the KL of the policy to the frozen reference (same initial weights: ~0 at step 0,
which checks the reference's packed forward against the policy's). Advantages: the batch's rewards are 0 and 1
within each group, so rows take part (``trainer.skip_zero_advantage`` as configured).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from areal_cli.config.resolve import Placement
from areal_cli.runconfig.autos import resolve
from areal_cli.runconfig.compose import compose
from areal_cli.trainer.model import build_policy, policy_options
from areal_cli.trainer.step import StepRunner
from areal_cli.transport.messages import Batch, GroupResult, Sample
from areal_cli.workflows.length_profile import load_profile
from benchmarks.trainer_profile import init, sync
from benchmarks.trainer_variants import checkpoint


def drawn_batch(step: int, groups: int, group_size: int, cap: int, profile, rng) -> Batch:
    """``groups`` groups of ``group_size`` samples: a 32-256-token prompt each, responses of lengths the
    profile draws for this step (rewards alternate 0 and 1 within a group)."""
    out = []
    for g in range(groups):
        prompt = rng.integers(100, 10000, int(rng.integers(32, 257))).astype(np.int32)
        samples = []
        for i in range(group_size):
            n = profile.draw(cap, f"{step}:{g}:{i}")
            samples.append(Sample(sample_index=i, prompt_ids=prompt, output_ids=rng.integers(100, 10000, n).astype(np.int32),
                                  logprobs=np.full(n, -2.0, np.float32), versions=np.full(n, step, np.int32),
                                  loss_mask=np.ones(n, np.uint8), reward=float(i % 2), reward_status="ok",
                                  finish_reason="length", num_turns=1, completion=""))
        out.append(GroupResult(group_id=g, prompt_id=f"s{step}g{g}", worker=0, samples=samples, gen_time_s=0.0,
                               gen_tokens=0))
    return Batch(step=step, groups=out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen2.5-1.5b-instruct")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=2048)
    ap.add_argument("--profile", default="arithmetic_long", help="rollout.length_profile the lengths come from")
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("overrides", nargs="*", help="config overrides (e.g. trainer.micro_batch_tokens=32768)")
    args = ap.parse_args()
    rank, world, device = init()
    given = Path(args.arch, "config.json").is_file()  # a checkpoint's directory, else an architecture's name
    path = Path(args.arch) if given else checkpoint(args.arch)
    cfg = resolve(compose([f"rollout.max_new_tokens={args.max_new_tokens}", f"rollout.group_size={args.group_size}",
                           f"trainer.batch_size={args.groups}", *args.overrides]),
                  Placement(trainer_gpu=device.type == "cuda", model_path=path))
    model = build_policy(path, device, torch.bfloat16, **policy_options(cfg))
    runner = StepRunner.build(model, path, cfg, device, torch.bfloat16, rank, world)
    forms, seconds = ([], 0.0) if args.no_precompile else runner.precompile()
    head = {"machine": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU", "gpus": world,
            "arch": args.arch, "weights": "as given" if given else "random",
            "compiled": bool(getattr(model, "compiled_head", False)),
            "precompiled_forms": forms, "precompile_s": seconds, "profile": args.profile,
            "max_new_tokens": args.max_new_tokens, "micro_batch_tokens": cfg.trainer.micro_batch_tokens,
            "varlen": cfg.trainer.varlen, "overrides": args.overrides, "date": time.strftime("%Y-%m-%d")}
    if rank == 0:
        print(json.dumps(head), flush=True)
    profile, rng, steps = load_profile(args.profile, seed=0), np.random.default_rng(rank), []
    for step in range(args.steps):
        b = drawn_batch(step, args.groups, args.group_size, args.max_new_tokens, profile, rng)
        lengths = [len(s.output_ids) + len(s.prompt_ids) for g in b.groups for s in g.samples]
        sync(device)
        t0 = time.perf_counter()
        m = runner.train(b, version=step)
        sync(device)
        row = {"step": step, "tokens": sum(lengths), "longest": max(lengths), "compiled_graphs": m["compiled_graphs"],
               "step_s": time.perf_counter() - t0, "grad_norm": m.get("grad_norm") or 0.0,
               "mfu": m.get("mfu", 0.0)}
        if "kl_ref" in m:  # algorithm.kl_coef > 0: the reference's logprobs against the policy's (0 at step 0)
            row["kl_ref"] = m["kl_ref"]
        steps.append(row)
        if rank == 0:
            kl = f", kl_ref {row['kl_ref']:.2e}" if "kl_ref" in row else ""
            print(f"step {step:3d}: {row['tokens']:7d} tokens (longest {row['longest']:5d}), compiled "
                  f"{row['compiled_graphs']} graphs, {row['step_s']:.2f} s, grad norm {row['grad_norm']:.3g}{kl}",
                  flush=True)
    times = [s["step_s"] for s in steps]
    summary = {"steps_that_compiled": [s["step"] for s in steps if s["compiled_graphs"]],
               "median_step_s": statistics.median(times), "slowest_step_s": max(times),
               "mfu_median": statistics.median(s["mfu"] for s in steps)}
    if rank == 0:
        print(json.dumps(summary), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({**head, **summary, "steps": steps}, indent=1))


if __name__ == "__main__":
    from areal_cli.runtime import run_main

    run_main(main)

"""The trainer step of the default run on the CPU: wall and CPU seconds per step, peak RSS.

    .venv/bin/python benchmarks/trainer_step.py [--steps 3] [override ...]
    .venv/bin/python benchmarks/trainer_step.py trainer.activation_checkpointing=true
    trainer.threads=1

One rank (gloo), the real ``StepRunner`` step on SmolLM2-135M (float32 weights; trainer.dtype as
``areal train`` resolves it here: bfloat16 autocast only where the CPU has it natively) and a batch
of the default run's shape (8 groups × 4 samples, prompts ~60 tokens, responses 10–64, 3 groups
with one reward for all samples: tests/trainer/helpers.py). Prints one JSON line: per-step wall and
CPU (user + system) seconds after one warm-up step, their medians, the step's metrics (skipped
rows, MFU when a peak is known) and the load average, since the 2-core machine is often shared:
compare variants run back to back.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainer"))

from helpers import default_shaped_batch  # noqa: E402

from areal_cli.model_source import resolve_model  # noqa: E402
from areal_cli.runconfig.autos import resolve  # noqa: E402
from areal_cli.runconfig.compose import compose  # noqa: E402
from areal_cli.runtime import set_threads  # noqa: E402
from areal_cli.trainer.model import build_policy  # noqa: E402
from areal_cli.trainer.step import StepRunner  # noqa: E402


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.threads=1")
    args = ap.parse_args()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    cfg = resolve(compose(args.overrides))  # the CPU's values, as `areal train` plans them here
    set_threads(cfg.trainer.threads)
    path = resolve_model(cfg.model)
    dtype = getattr(torch, cfg.trainer.dtype)
    device = torch.device("cpu")
    model = build_policy(path, device, dtype, cfg.trainer.activation_checkpointing == "true")
    runner = StepRunner.build(model, path, cfg, device, dtype, rank=0, world=1)
    batch = default_shaped_batch()
    walls, cpus = [], []
    for step in range(args.steps + 1):
        t0, c0 = time.perf_counter(), cpu_s()
        metrics = runner.train(batch, version=0)
        if step:  # the first step allocates AdamW's state
            walls.append(time.perf_counter() - t0)
            cpus.append(cpu_s() - c0)
    print(json.dumps({"overrides": args.overrides, "dtype": str(cfg.trainer.dtype),
                      "threads": torch.get_num_threads(),
                      "wall_s": [round(w, 2) for w in walls], "cpu_s": [round(c, 2) for c in cpus],
                      "median_wall_s": round(statistics.median(walls), 2),
                      "median_cpu_s": round(statistics.median(cpus), 2),
                      "peak_rss_gb": round(metrics["peak_rss_gb"], 2),
                      "skipped_rows": metrics["skipped_rows"],
                      "micro_batches": metrics["micro_batches"],
                      "model_tflops_per_s": round(metrics["model_tflops_per_s"], 4),
                      "load_avg": [round(x, 1) for x in os.getloadavg()]}))
    dist.destroy_process_group()


if __name__ == "__main__":
    from areal_cli.runtime import run_main

    run_main(main)

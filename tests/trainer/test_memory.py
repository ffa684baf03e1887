"""The trainer's peak resident memory on a short real run: four steps of the default model
(SmolLM2-135M, float32 weights under trainer.dtype as resolved here, AdamW) on a batch of the
default run's shape (8 groups × 4 samples, prompts ~60 tokens, responses 10–64), in a fresh
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_cli.config.schema import RootConfig
from areal_cli.launcher.plan import allocator_env
from areal_cli.runconfig.autos import resolve

PEAK_RSS_BOUND_GB = {"tcmalloc": 2.5, "jemalloc": 2.7, "system": 4.0}
"""Measured on the 2-core CPU with the default config: 8.0 GiB before the output layer ran in
chunks, zero-advantage rows were skipped, one CPU rank stopped using FSDP and activation
checkpointing took effect (it is on by default); 3.3–3.5 GiB after with glibc's malloc (5.3–5.4 GiB
with trainer.activation_checkpointing=false); 2.7–2.8 GiB on tcmalloc, which the launcher gives the
trainer when it is installed (launcher.allocator); 2.2 GiB on tcmalloc with AdamW's moments in
bfloat16 (trainer.optim_state=auto, the default, gives bfloat16 on the CPU); 2.16–2.27 GiB over four
steps of differing lengths with trainer.shape_buckets=4 (the default), 2.20 with 0."""

SCRIPT = """
import json, sys
import torch, torch.distributed as dist
sys.path.insert(0, {helpers!r})
from helpers import default_shaped_batch
from areal_cli.runconfig.compose import compose
from areal_cli.runconfig.autos import resolve
from areal_cli.model_source import resolve_model
from areal_cli.trainer.model import build_policy
from areal_cli.trainer.step import StepRunner
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
cfg = resolve(compose([]))  # the CPU's values, as `areal train` plans them here
torch.set_num_threads(cfg.trainer.threads)
path = resolve_model(cfg.model)
dtype = getattr(torch, cfg.trainer.dtype)  # bfloat16 where this CPU computes it natively
model = build_policy(path, torch.device("cpu"), dtype,
                     cfg.trainer.activation_checkpointing == "true")
runner = StepRunner.build(model, path, cfg, torch.device("cpu"), dtype, 0, 1)
for seed in range(4):  # lengths differ between the batches, as between the steps of a run
    metrics = runner.train(default_shaped_batch(seed=seed), version=0)
print(json.dumps(metrics))
from areal_cli.runtime import exit_now
exit_now(0)  # as `areal train` ends its trainer: no interpreter teardown beside a gloo thread
"""


@pytest.mark.slow  # a whole run (30-60 s on 2 cores): `make test-slow`, which CI runs too
def test_trainer_peak_memory_of_four_default_steps():
    here = Path(__file__).parent
    allocator = resolve(RootConfig()).launcher.allocator  # launcher.allocator=auto, as planned here
    alloc_env, _ = allocator_env(allocator)  # what `areal train` gives the trainer here
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(helpers=str(here))],
                          capture_output=True,
                          text=True, timeout=900,
                          env={**os.environ, **alloc_env, "PYTHONPATH": str(here.parents[1])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert metrics["skipped_rows"] == 12  # 3 of the 8 groups had one reward for all 4 samples
    assert 1.0 < metrics["peak_rss_gb"] < PEAK_RSS_BOUND_GB[allocator], (allocator,
                                                                         metrics["peak_rss_gb"])

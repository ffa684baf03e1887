"""A guard for CPUs without native bfloat16: under torch's AVX2-only settings (as an AVX2 + FMA
processor computes, whatever this one has) the default config resolves to float32 and one trainer
step of the default run's shape stays within a bound (``benchmarks/trainer_step.py``, the real
``StepRunner`` on SmolLM2-135M). A step that computes in emulated bfloat16 takes tens of times as
long and fails it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "DNNL_MAX_CPU_ISA": "AVX2"}
"""torch's ATen kernels and oneDNN limited to AVX2, as on an AVX2-only processor."""

STEP_BOUND_S = 120.0
"""The median step's wall time may not pass this (see BENCHMARKS.md "First run on the CPU" for the
measured step; the bound leaves room for a slower or busier machine, not for emulated bfloat16)."""


@pytest.mark.slow  # two trainer steps of the default model: `make test-slow`, which CI runs
def test_an_avx2_only_cpu_trains_in_float32_within_the_step_bound():
    root = Path(__file__).resolve().parents[2]
    script = str(root / "benchmarks" / "trainer_step.py")
    proc = subprocess.run([sys.executable, script, "--steps", "1"], capture_output=True, text=True,
                          timeout=900, env={**os.environ, **AVX2_ONLY})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["dtype"] == "float32", out
    assert out["median_wall_s"] <= STEP_BOUND_S, out

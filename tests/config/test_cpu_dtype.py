"""The CPU's compute dtype: bfloat16 only where the processor has it natively (its flags claim it
and a measured bfloat16 matmul is not slower than float32's by more than ``SLOWER_BF16``), float32
elsewhere; the verdict cached per CPU model and torch's ISA settings; the plan says which and why,
and warns where an explicit bfloat16 will be emulated."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from areal_cli.config import cpu_dtype
from areal_cli.config.resolve import CPU, Placement
from areal_cli.launcher.plan import dtype_notes
from areal_cli.runconfig.autos import resolve
from areal_cli.runconfig.compose import compose


def test_the_flags_that_claim_native_bfloat16_per_architecture():
    assert cpu_dtype.flags_claim_bf16("x86_64", {"avx2", "fma", "avx512f", "amx_bf16"})
    assert cpu_dtype.flags_claim_bf16("x86_64", {"avx512f", "avx512_bf16"})
    # AVX-512 without BF16
    assert not cpu_dtype.flags_claim_bf16("x86_64", {"avx2", "fma", "avx512f"})
    assert cpu_dtype.flags_claim_bf16("aarch64", {"fp", "asimd", "bf16"})
    assert not cpu_dtype.flags_claim_bf16("aarch64", {"fp", "asimd", "sve"})
    assert not cpu_dtype.flags_claim_bf16("riscv64", {"bf16"})


def test_where_the_flags_claim_no_bfloat16_it_is_measured_to_be_emulated():
    """On a processor without the flags, the measurement agrees that bfloat16 is slow, so the flags
    are not what makes float32 the choice (on one with them, the verdict comes from measuring)."""
    _, flags = cpu_dtype.cpu_flags()
    if cpu_dtype.flags_claim_bf16(platform.machine(), flags):
        pytest.skip("this CPU claims native bfloat16")
    assert cpu_dtype.measure_bf16_over_fp32() > cpu_dtype.SLOWER_BF16


def test_the_verdict_is_measured_once_and_read_back_per_cpu_and_isa_settings(tmp_path):
    cache = tmp_path / "cpu-dtype.json"
    first = cpu_dtype.choose(cache)
    assert first.dtype in ("bfloat16", "float32") and first.reason
    [key] = json.loads(cache.read_text())
    assert platform.machine() in key and "ATEN_CPU_CAPABILITY=" in key
    # the cached verdict is what a second call returns (an edited entry proves it was read, not
    # measured)
    known = json.loads(cache.read_text())
    known[key]["reason"] = "read from the cache"
    cache.write_text(json.dumps(known))
    assert cpu_dtype.choose(cache).reason == "read from the cache"
    # another ISA setting is another key: decided anew, from the flags or by measuring under it
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
           "AREAL_CACHE": str(tmp_path)}
    code = "from areal_cli.config.cpu_dtype import choose; choose()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    known = json.loads(cache.read_text())
    [other] = set(known) - {key}
    assert "ATEN_CPU_CAPABILITY=avx2" in other and "ONEDNN_MAX_CPU_ISA=AVX2" in other
    if known[other]["native_flags"]:  # the flags claim it: the verdict under AVX2 was measured
        assert known[other]["bf16_over_fp32"] > 0
    else:
        assert known[other]["dtype"] == "float32"


def test_a_corrupt_or_unwritable_cache_costs_a_measurement_not_the_run(tmp_path):
    cache = tmp_path / "cpu-dtype.json"
    cache.write_text("{not json")
    assert cpu_dtype.choose(cache).dtype in ("bfloat16", "float32")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert cpu_dtype.choose(ro / "sub" / "cpu-dtype.json").dtype in ("bfloat16", "float32")
    finally:
        ro.chmod(0o700)


def test_auto_on_the_cpu_follows_the_processor_and_gpus_keep_bfloat16():
    verdict = cpu_dtype.choose().dtype
    cpu = resolve(compose([]), CPU)
    assert (cpu.trainer.dtype, cpu.engine.dtype, cpu.weights.dtype) == (verdict,) * 3
    # the trainer on a GPU, the rollout worker on the CPU: each its own rule, the wire the engine's
    mixed = resolve(compose([]), Placement(trainer_gpu=True, rollout_gpu=False))
    dtypes = (mixed.trainer.dtype, mixed.engine.dtype, mixed.weights.dtype)
    assert dtypes == ("bfloat16", verdict, verdict)
    explicit = resolve(compose(["trainer.dtype=bfloat16", "engine.dtype=float16"]), CPU)
    assert (explicit.trainer.dtype, explicit.engine.dtype) == ("bfloat16", "float16")  # honoured


def test_the_plan_says_which_dtype_and_why_and_warns_where_an_explicit_bfloat16_is_emulated():
    verdict = cpu_dtype.choose()
    asked = compose(["trainer.dtype=bfloat16"])
    lines = dtype_notes(asked, resolve(asked, CPU), CPU)
    trainer, engine = lines[0], lines[1]
    assert trainer.startswith("trainer.dtype=bfloat16 (as set")
    assert engine.startswith(f"engine.dtype={verdict.dtype} (auto on the CPU: {verdict.reason}")
    assert ("WARNING" in trainer) == (not verdict.bf16_native)
    on_gpu = Placement(trainer_gpu=True)
    gpu = dtype_notes(compose([]), resolve(compose([]), on_gpu), on_gpu)
    assert gpu[0] == "trainer.dtype=bfloat16 (auto: bfloat16 on a GPU)"

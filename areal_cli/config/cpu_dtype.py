"""Which dtype the CPU computes in: bfloat16 only where the processor has it natively, else float32.

A CPU without bfloat16 instructions (x86_64 without AVX512_BF16 or AMX, aarch64 without BF16)
emulates every bfloat16 matmul, one to two orders of magnitude slower than float32. So
``engine.dtype``/``trainer.dtype`` ``auto`` resolve to bfloat16 on the CPU only where
``choose()`` says it is native: the processor's flags claim it *and* a short measurement
confirms it (torch may be told to compute as an older CPU does: ``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA``). The verdict is cached per CPU model, torch version and those settings
(``<AREAL_CACHE>/cpu-dtype.json``), so the measurement runs once per machine kind.
No torch import at module level: ``--help`` stays instant.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
"""Settings that make torch compute as a lesser CPU does: part of the cache key."""

X86_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""x86_64 /proc/cpuinfo flags of native bfloat16 arithmetic."""

SLOWER_BF16 = 3.0
"""bfloat16 counts as native only while its measured matmul takes at most this many times
float32's (native bfloat16 is faster than float32; emulated, tens of times slower)."""


@dataclass(frozen=True)
class CpuDtype:
    """The verdict for this CPU: ``dtype`` ("bfloat16" | "float32") and why, in words."""

    dtype: str
    reason: str
    native_flags: bool
    bf16_over_fp32: float
    """Measured time of a bfloat16 matmul over float32's (0 = not measured: no flag claimed it)."""

    @property
    def bf16_native(self) -> bool:
        return self.dtype == "bfloat16"


def gpu_driver() -> bool:
    """Whether an NVIDIA driver is present here (no torch import): where a process not placed by a
    launcher (an evaluation) computes on its default device, that device is a GPU."""
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def cpu_flags() -> tuple[str, set[str]]:
    """(model name, feature flags) of the first processor in /proc/cpuinfo (empty where
    unreadable)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        named = model in ("", platform.machine())
        if key in ("model name", "cpu part") and value.strip() and named:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return model, flags


def flags_claim_bf16(machine: str, flags: set[str]) -> bool:
    """Whether the processor's flags claim native bfloat16 arithmetic."""
    if machine in ("x86_64", "amd64", "AMD64"):
        return any(f in flags for f in X86_BF16_FLAGS)
    if machine in ("aarch64", "arm64"):
        return "bf16" in flags
    return False


def measure_bf16_over_fp32(size: int = 256, repeats: int = 5) -> float:
    """Time of a ``size``² bfloat16 matmul over the same in float32, best of ``repeats`` each
    (one thread; tens of milliseconds where bfloat16 is emulated, well under that where native)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = {}
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.randn(size, size).to(dtype)
            b = torch.randn(size, size).to(dtype)
            a @ b  # the first call builds the kernel
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - t)
            best[dtype] = min(times)
        return best[torch.bfloat16] / max(best[torch.float32], 1e-9)
    finally:
        torch.set_num_threads(threads)


def choose(cache: Path | None = None) -> CpuDtype:
    """The CPU's compute dtype and why; measured once per key, then read from ``cache``."""
    machine = platform.machine()
    model, flags = cpu_flags()
    claim = flags_claim_bf16(machine, flags)
    isa = [f"{k}={os.environ.get(k, '')}" for k in ISA_ENV]
    key = "|".join([machine, model, _torch_version(), *isa])
    cache = cache or _cache_path()
    known = _read(cache)
    if key in known:
        try:
            return CpuDtype(**known[key])
        except TypeError:  # an older entry's shape: measure again
            pass
    verdict = _decide(machine, model, claim)
    known[key] = asdict(verdict)
    _write(cache, known)
    return verdict


def _decide(machine: str, model: str, claim: bool) -> CpuDtype:
    where = f"{model or machine} ({machine})"
    if not claim:
        want = "AMX or AVX512_BF16" if machine in ("x86_64", "amd64", "AMD64") else "BF16"
        return CpuDtype("float32", f"{where} has no native bfloat16 ({want} not in its flags): "
                        "bfloat16 would be emulated, tens of times slower", False, 0.0)
    ratio = measure_bf16_over_fp32()
    if ratio > SLOWER_BF16:
        isa = ", ".join(f"{k}={os.environ[k]}" for k in ISA_ENV if os.environ.get(k))
        return CpuDtype("float32", f"{where} claims native bfloat16, but a bfloat16 matmul "
                        f"measured {ratio:.1f}x float32's time ({isa or 'this torch build'}): "
                        "emulated here", True, ratio)
    return CpuDtype("bfloat16", f"{where} computes bfloat16 natively (a matmul measured "
                    f"{ratio:.2f}x float32's time)", True, ratio)


def _torch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return "torch " + version("torch")
    except PackageNotFoundError:
        return "torch ?"


def _cache_path() -> Path:
    root = Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal"))
    return root / "cpu-dtype.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict) -> None:
    """Best effort: a read-only cache only costs the measurement again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass

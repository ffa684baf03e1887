"""tools/torch_cpu_build.py: `make install` stops before a CUDA build of torch lands on a machine
without a GPU (PyPI's torch for aarch64 is one), and lets a CPU build through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "torch_cpu_build.py"
sys.path.insert(0, str(TOOL.parent))
from torch_cpu_build import cuda_requirements  # noqa: E402


def report(requires: list[str]) -> dict:
    return {"install": [{"metadata": {"name": "torch", "version": "2.13.0",
                                      "requires_dist": requires}}]}


def test_a_cuda_build_is_told_from_a_cpu_build_by_its_requirements():
    assert cuda_requirements(report(["filelock", "sympy>=1.13.3"])) == []
    cuda = cuda_requirements(report(["filelock", 'nvidia-nccl-cu13==2.29.7; platform_system == '
                                                 '"Linux"']))
    assert cuda == ['nvidia-nccl-cu13==2.29.7; platform_system == "Linux"']
    assert cuda_requirements({"install": []}) == []  # already installed: nothing to judge


def _as_aarch64(tmp_path) -> dict:
    """pip resolving as an aarch64 machine would (wheels only, for this Python)."""
    return dict(os.environ, PIP_PLATFORM="manylinux_2_28_aarch64", PIP_ONLY_BINARY=":all:",
                PIP_PYTHON_VERSION=f"{sys.version_info.major}.{sys.version_info.minor}",
                PIP_TARGET=str(tmp_path / "t"))


def test_the_aarch64_build_the_configured_index_offers_is_named_before_it_installs(tmp_path):
    env = _as_aarch64(tmp_path)
    probe = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                            "--no-deps", "--report", "-", "torch==2.13.0"], env=env,
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("pip's indexes offer no torch 2.13.0 wheel for aarch64 here")
    [wheel] = json.loads(probe.stdout)["install"]
    is_cuda = any(r.startswith("nvidia-") for r in wheel["metadata"].get("requires_dist", []))
    out = subprocess.run([sys.executable, str(TOOL), "torch==2.13.0"], env=env,
                         capture_output=True, text=True)
    if is_cuda:  # (PyPI's aarch64 torch is one) refused at once, naming the fix
        assert out.returncode == 2
        assert "only as a CUDA build" in out.stderr and "PyTorch CPU builds" in out.stderr
    else:
        assert out.returncode == 0, out.stderr


def test_this_machines_own_build_goes_through():
    out = subprocess.run([sys.executable, str(TOOL), "torch==2.13.0"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr

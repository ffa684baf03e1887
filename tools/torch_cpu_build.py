"""Before `make install` puts torch on a machine without a GPU: the build pip's configured indexes
would install for this machine must be a CPU build. Where it is a CUDA build (its requirements
name nvidia-* libraries: several GB, and no GPU to use them; PyPI's torch for x86_64 and aarch64
alike), stop at once, naming the fix, instead of downloading them.

    python tools/torch_cpu_build.py torch==2.13.0      # exit 0: a CPU build (or already installed)

Exit 2 with the reason otherwise; exit 0 without a verdict where pip cannot resolve offline (its own
error then follows from the install itself).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys


def cuda_requirements(report: dict) -> list[str]:
    """The nvidia-* requirements of the torch that ``report`` (pip's ``--report``) would install."""
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        if meta.get("name", "").lower() == "torch":
            return [r for r in meta.get("requires_dist", []) or []
                    if r.lower().startswith("nvidia-")]
    return []


def main() -> int:
    spec = sys.argv[1] if len(sys.argv) > 1 else "torch"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                          "--no-deps", "--report", "-", spec],
                         capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        return 0
    try:
        report = json.loads(out.stdout)
    except ValueError:
        return 0
    cuda = cuda_requirements(report)
    if not cuda:
        return 0
    names = ", ".join(r.split(";")[0] for r in cuda[:3])
    print(f"make install: pip's configured indexes offer {spec} for this {platform.machine()} "
          f"machine only as a CUDA build (it requires {names}"
          ", ...: several GB of GPU libraries, and this machine has no GPU). Point pip at the "
          "PyTorch CPU builds first (pip config set global.extra-index-url <the PyTorch CPU "
          "wheel index>, or PIP_EXTRA_INDEX_URL), then run make install again.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

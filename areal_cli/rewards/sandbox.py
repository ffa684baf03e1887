"""Running untrusted Python in a separate, limited subprocess (see sandbox_child.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).with_name("sandbox_child.py")
OUTPUT_TAIL = 2000
EXIT_STATUS = {0: "passed", 1: "failed", 124: "timeout", 125: "error"}


@dataclass
class Limits:
    """What one sandboxed program may use."""

    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU)."""
    wall_s: float = 8.0
    """Wall seconds before the whole process tree is killed."""
    mem_mb: int = 1024
    """Address space in MiB (RLIMIT_AS)."""
    nproc: int = 32
    """Processes (RLIMIT_NPROC)."""
    fsize_mb: int = 16
    """Largest file it may write, stdout included, in MiB (RLIMIT_FSIZE)."""


@dataclass
class SandboxResult:
    status: str
    """"passed" (ran to its end) | "failed" | "timeout" | "error" (sandbox setup)."""
    output: str
    """Tail of the program's stdout+stderr, led by the sandbox's isolation line."""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run_python(program: str, limits: Limits, namespaces: bool = True) -> SandboxResult:
    """Run `program` in a fresh temporary directory under `limits`; never raises on its behalf.

    The child is its own session; its process group is killed when it ends or overstays.
    `namespaces=False` forces the unprivileged fallback (used by tests).
    """
    base = Path(tempfile.mkdtemp(prefix="areal_sandbox_"))
    try:
        base.chmod(0o711)
        workdir = base / "work"
        workdir.mkdir()
        spec = dict(
            program=program, workdir=str(workdir), namespaces=namespaces, cpu_s=limits.cpu_s,
            wall_s=limits.wall_s, mem_mb=limits.mem_mb, nproc=limits.nproc,
            fsize_mb=limits.fsize_mb,
        )  # fmt: skip
        code = _launch(json.dumps(spec), base / "output.txt", workdir, limits.wall_s + 5)
        output = _tail(base / "output.txt")
        return SandboxResult(EXIT_STATUS.get(code, "failed"), output)
    finally:
        shutil.rmtree(base, onerror=_force_remove)


def _launch(spec: str, out_path: Path, workdir: Path, wall_s: float) -> int:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8"}
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", str(CHILD)],
            stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=workdir, env=env,
        )  # fmt: skip
        try:
            proc.communicate(spec.encode(), timeout=wall_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            return 124
        finally:
            _kill_group(proc.pid)
    return proc.returncode


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group already ended: the usual case
        return


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - OUTPUT_TAIL))
        return f.read().decode("utf-8", errors="replace")


def _force_remove(func, path, exc_info) -> None:
    """rmtree error handler: a program may leave read-only directories; open them and retry."""
    parent = os.path.dirname(path)
    os.chmod(parent, 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
        shutil.rmtree(path, onerror=_force_remove)
    else:
        os.unlink(path)

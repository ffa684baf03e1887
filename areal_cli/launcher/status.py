"""``areal status <run_dir>``: which processes live, and the last metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path


def show(run_dir: str) -> None:
    d = Path(run_dir)
    if not (d / "config.yaml").is_file():
        raise SystemExit(f"areal: {d} is not a run directory (no config.yaml)")
    pids = json.loads((d / "pids.json").read_text()) if (d / "pids.json").exists() else {}
    job = d / "slurm_job_id"
    if job.exists():
        _slurm(job.read_text().strip())
    for name, pid in pids.items():
        alive = os.path.exists(f"/proc/{pid}")
        print(f"{name:12s} pid {pid:7d}  {'running' if alive else 'exited'}")
    from areal_cli.durable import TornFile, read_jsonl

    try:
        rows, torn = read_jsonl(d / "metrics.jsonl")
    except TornFile as err:
        raise SystemExit(f"areal: {err}") from None
    if torn:
        print("metrics.jsonl ends in a torn line (a kill mid-write); resume drops it")
    if rows:
        last = rows[-1]
        print(f"{len(rows)} steps; last: " + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in last.items()))
    else:
        print("no steps yet")


def _slurm(job_id: str) -> None:
    """The job's state and its steps (controller, rollout workers, trainer) from Slurm itself."""
    import shutil
    import subprocess

    if not shutil.which("sacct"):
        print(f"slurm job {job_id} (sacct not on PATH here)")
        return
    out = subprocess.run(["sacct", "-j", job_id, "-n", "-P", "-o", "JobID,JobName,State,Elapsed,NodeList"],
                         capture_output=True, text=True, timeout=30)
    print(f"slurm job {job_id}")
    for line in out.stdout.splitlines():
        print("  " + "  ".join(line.split("|")))

"""A real run through sbatch on a Slurm cluster (launch/slurm/setup-local-cluster.sh makes one).

CPU, one node: ~20 s model load + ~25 s per step, so each test budgets a few minutes.
Skipped when ``sbatch`` is not on PATH or no node is up.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SMALL = ["trainer.steps=2", "trainer.batch_size=2", "rollout.max_new_tokens=16",
         "rollout.group_size=2"]


def _cluster_up() -> str:
    if not shutil.which("sbatch"):
        return ("sbatch is not on PATH (no Slurm here; launch/slurm/setup-local-cluster.sh sets "
                "one up)")
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if out.returncode or not any(s.strip("*~#") in ("idle", "mixed") for s in out.stdout.split()):
        return f"no idle Slurm node (sinfo: {out.stdout.strip() or out.stderr.strip()})"
    return ""


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(_cluster_up()), reason=_cluster_up() or "cluster up")]


def _submit(run_dir: Path, *extra: str) -> str:
    areal = str(Path(sys.executable).with_name("areal"))
    subprocess.run([areal, "train", "launcher=slurm", f"run_dir={run_dir}", *SMALL, *extra],
                   check=True, timeout=120)
    return (run_dir / "slurm_job_id").read_text().strip()


def _job_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True)
    for word in out.stdout.split():
        if word.startswith("JobState="):
            return word.split("=", 1)[1]
    return "GONE"


def _wait_done(job_id: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _job_state(job_id)
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED"):
            return state
        time.sleep(2)
    subprocess.run(["scancel", job_id])
    pytest.fail(f"job {job_id} still {_job_state(job_id)} after {timeout_s}s")


def _ours(run_dir: Path) -> str:
    out = subprocess.run(["pgrep", "-af", f"areal_cli.*{run_dir}"], capture_output=True, text=True)
    return out.stdout.strip()


def _logs(run_dir: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                     for p in sorted((run_dir / "logs").glob("*")))


def test_train_through_sbatch(tmp_path):
    run_dir = tmp_path / "run"
    job_id = _submit(run_dir)
    state = _wait_done(job_id, 480)
    assert state == "COMPLETED", f"job {job_id}: {state}\n{_logs(run_dir)}"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
            if x.strip()]
    assert len(rows) == 2, rows
    assert ((run_dir / "config.yaml").is_file()
            and (run_dir / "trajectories.jsonl").stat().st_size > 0)
    assert (run_dir / "checkpoints" / "final").is_dir()
    ep = json.loads((run_dir / "endpoints.json").read_text())
    assert not ep["work"].startswith("tcp://127.0.0.1:")  # advertised by hostname
    assert not _ours(run_dir)


def test_scancel_leaves_no_process(tmp_path):
    run_dir = tmp_path / "run"
    job_id = _submit(run_dir, "trainer.steps=20")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
            (run_dir / "logs" / "trainer-0.log").exists() and "ready" in
            (run_dir / "logs" / "trainer-0.log").read_text(errors="replace")):
        time.sleep(1)
    assert _ours(run_dir), f"nothing of the run is running:\n{_logs(run_dir)}"
    subprocess.run(["scancel", job_id], check=True)
    _wait_done(job_id, 90)
    deadline = time.monotonic() + 30  # KillWait of the test cluster is 10 s
    while time.monotonic() < deadline and _ours(run_dir):
        time.sleep(1)
    assert not _ours(run_dir), _ours(run_dir)

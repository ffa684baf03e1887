"""``areal train launcher=slurm``: write the run directory and an sbatch script, submit it.

The run directory gets ``config.yaml`` (rollout.workers and trainer.ranks set from the node
layout), ``job.sbatch`` and, once submitted, ``slurm_job_id``; the job's prepare step writes
``endpoints.json`` (its own hostnames and ports) before any step starts.
``--dry-run`` prints the layout and the script and writes nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from areal_cli.config.resolve import Placement
from areal_cli.config.schema import RootConfig
from areal_cli.durable import atomic_write
from areal_cli.launcher.preflight import UserError, preflight
from areal_cli.launcher.slurm_layout import apply_layout, slurm_layout
from areal_cli.launcher.slurm_script import render_sbatch
from areal_cli.rundir import RunDir


def build(cfg: RootConfig, python: str | None = None):
    """(plan, script, notes) for ``cfg``; raises ValueError naming the fix."""
    from areal_cli.launcher.plan import make_plan

    if cfg.cluster.gpus or cfg.rollout.gpus or cfg.trainer.gpus:
        raise ValueError("cluster.gpus / rollout.gpus / trainer.gpus are for launcher=local; on "
                         "Slurm use launcher.gpus_per_node and launcher.gen_nodes")
    if cfg.launcher.signal_s < 0:
        raise ValueError(f"launcher.signal_s={cfg.launcher.signal_s}: must be >= 0")
    lay = slurm_layout(cfg)
    notes = apply_layout(cfg, lay)
    # run_dir and commands; devices are Slurm's: the config is resolved for the nodes' GPUs
    plan = make_plan(cfg, gpus=[], placement=Placement(trainer_gpu=lay.trainer_gpus > 0))
    return plan, render_sbatch(plan.cfg, lay, plan.run_dir, python or sys.executable), notes


def submit(cfg: RootConfig) -> Path:
    try:
        plan, script, notes = build(cfg)
    except ValueError as err:
        raise UserError(f"  - {err}") from None
    for n in notes:
        print(f"areal: {n}", file=sys.stderr)
    cfg = plan.cfg
    if cfg.dry_run:
        print(script)
        return plan.run_dir
    preflight(cfg)
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise UserError("  - sbatch is not on PATH: run this on a Slurm login node, or use "
                        "launcher=local (--dry-run prints the script without Slurm)")
    plan.write()
    path = RunDir(plan.run_dir).sbatch
    atomic_write(path, script)
    out = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True)
    if out.returncode:
        raise UserError(f"  - sbatch {path} failed (exit code "
                        f"{out.returncode}):\n{out.stderr.strip()}")
    job_id = out.stdout.strip().split(";")[0]
    atomic_write(RunDir(plan.run_dir).slurm_job_id, job_id + "\n")
    print(f"submitted Slurm job {job_id}\nrun_dir: {plan.run_dir}\n"
          f"follow: squeue -j {job_id}; tail -f {plan.run_dir}/logs/slurm-{job_id}.out\n"
          f"stop:   scancel {job_id}", flush=True)
    return plan.run_dir

"""``areal status <run_dir>``: which processes live, the last step's key figures, a sparkline of
the reward over every step, and the whole last row of metrics.jsonl."""

from __future__ import annotations

import json
import os

from areal_cli.rundir import RunDir


def show(run_dir: str) -> None:
    d = RunDir(run_dir)
    if not d.config.is_file():
        raise SystemExit(f"areal: {d.root} is not a run directory (no config.yaml)")
    pids = json.loads(d.pids.read_text()) if d.pids.exists() else {}
    job = d.slurm_job_id
    if job.exists():
        _slurm(job.read_text().strip())
    for name, pid in pids.items():
        alive = os.path.exists(f"/proc/{pid}")
        print(f"{name:12s} pid {pid:7d}  {'running' if alive else 'exited'}")
    from areal_cli.durable import TornFile, read_jsonl

    try:
        rows, torn = read_jsonl(d.metrics)
    except TornFile as err:
        raise SystemExit(f"areal: {err}") from None
    if torn:
        print("metrics.jsonl ends in a torn line (a kill mid-write); resume drops it")
    if rows:
        _figures(rows, _planned_steps(d))
        last = rows[-1]
        print(f"{len(rows)} steps; last: " + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in last.items()))
    else:
        print("no steps yet")


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 60) -> str:
    """``values`` as block characters, lowest ▁ to highest █; more than ``width`` values are
    averaged in ``width`` buckets."""
    if len(values) > width:
        edges = [round(i * len(values) / width) for i in range(width + 1)]
        values = [sum(values[a:b]) / (b - a) for a,
                  b in zip(edges, edges[1:], strict=False) if b > a]
    lo, hi = min(values, default=0.0), max(values, default=0.0)
    scale = (len(SPARK) - 1) / (hi - lo) if hi > lo else 0.0
    return "".join(SPARK[round((v - lo) * scale)] for v in values)


def _planned_steps(d: RunDir) -> int | None:
    import yaml

    try:
        return int(yaml.safe_load(d.config.read_text())["trainer"]["steps"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return None


def _figures(rows: list[dict], steps: int | None) -> None:
    """The last step's key figures and the reward's sparkline, through rich (plain text off a
    terminal)."""
    from rich.console import Console
    from rich.table import Table

    last, rewards = rows[-1], [r.get("reward_mean", 0.0) for r in rows]
    walls = sorted(r["step_wall_s"] for r in rows[1:]
                   if isinstance(r.get("step_wall_s"), (int, float)))
    left = steps - last["step"] - 1 if steps else 0
    t = Table(show_header=False, box=None, pad_edge=False)
    for name, value in [
        ("step", f"{last['step'] + 1}" + (f"/{steps}" if steps else "")),
        ("reward",
         f"{last.get('reward_mean', 0):.3f}  (last 5 steps: "
         f"{sum(rewards[-5:]) / len(rewards[-5:]):.3f})"),
        ("staleness",
         f"max {last.get('staleness_max', 0)}  mean {last.get('staleness_mean', 0):.2f}"),
        ("tokens/s",
         f"gen {last.get('gen_tokens_per_s', 0):.0f}  "
         f"train {last.get('train_tokens_per_s', 0):.0f}"),
        ("step time", f"{last.get('step_wall_s', 0):.2f}s  (trainer "
                      f"{last.get('step_time_s', 0):.2f}s, weight sync "
                      f"{1000 * last.get('weight_sync_s', 0):.0f} ms, trackers "
                      f"{1000 * last.get('log_s', 0):.0f} ms)"),
        ("wall",
         f"{last.get('wall_time_s', 0):.0f}s" + (f"  ETA {left * walls[len(walls) // 2]:.0f}s"
                                                           if left > 0 and walls else "")),
        ("reward/step", f"{sparkline(rewards)}  {min(rewards):.3f} .. {max(rewards):.3f}"),
    ]:
        t.add_row(f"[bold]{name}[/bold]", value)
    Console(highlight=False).print(t)


def _slurm(job_id: str) -> None:
    """The job's state and its steps (controller, rollout workers, trainer) from Slurm itself."""
    import shutil
    import subprocess

    if not shutil.which("sacct"):
        print(f"slurm job {job_id} (sacct not on PATH here)")
        return
    out = subprocess.run(["sacct", "-j", job_id, "-n", "-P", "-o",
                          "JobID,JobName,State,Elapsed,NodeList"],
                         capture_output=True, text=True, timeout=30)
    print(f"slurm job {job_id}")
    for line in out.stdout.splitlines():
        print("  " + "  ".join(line.split("|")))

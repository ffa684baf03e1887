"""Figures of one finished run, read from its run directory (the contract files only).

Everything after the first ``warmup`` steps: effective trained tokens per second of wall
time, per-step wall time, trainer and generation busy fractions from timestamps, weight-sync
and weight-update pause times, the reward curve and staleness.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def trainer_intervals(rows: list[dict]) -> list[tuple[float, float]]:
    """[start, end] of each step's training + weight sync, ending when the controller saw it."""
    out = []
    for r in rows:
        busy = r.get("step_time_s", 0.0) + r.get("weight_sync_s", 0.0)
        out.append((r["wall_time_s"] - busy, r["wall_time_s"]))
    return out


def generation_intervals(run_dir: Path) -> list[tuple[float, float]]:
    """[start, end] of each trained group's generation, where trajectories carry timestamps
    (``done_wall_s`` and ``gen_time_s``); [] where they do not."""
    seen, out = set(), []
    for t in read_jsonl(run_dir / "trajectories.jsonl"):
        if "done_wall_s" not in t or "gen_time_s" not in t or t.get("group_id") in seen:
            continue
        seen.add(t.get("group_id"))
        out.append((t["done_wall_s"] - t["gen_time_s"], t["done_wall_s"]))
    return out


def covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by the union of ``intervals``."""
    total, end = 0.0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def generation_busy(run_dir: Path, rows: list[dict], warmup: int, lo: float, hi: float) -> tuple:
    """(fraction, how it was measured) of the window during which generation ran."""
    spans = generation_intervals(run_dir)
    if spans:
        return covered(spans, lo, hi) / max(hi - lo, 1e-9), "trajectory timestamps"
    updates = [u for u in read_jsonl(run_dir / "weight_updates.jsonl") if "gen_busy_s" in u]
    if updates:  # the engine's own clock: seconds with requests in flight between two updates
        versions = {r["version"] for r in rows[warmup:]}
        workers = {u["worker"] for u in updates}
        busy = sum(u["gen_busy_s"] for u in updates if u["version"] in versions) / len(workers)
        return min(1.0, busy / max(hi - lo, 1e-9)), "engine busy clock"
    return None, "not recorded (the engine and the trajectories carry no generation timestamps)"


def summarize_run(run_dir: Path, warmup: int) -> dict:
    run_dir = Path(run_dir)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    if len(rows) <= warmup:
        raise ValueError(f"{run_dir}: {len(rows)} steps, not more than the {warmup} warm-up steps; "
                         "raise trainer.steps or lower bench.warmup")
    post = rows[warmup:]
    lo = rows[warmup - 1]["wall_time_s"] if warmup else 0.0
    hi = rows[-1]["wall_time_s"]
    window = max(hi - lo, 1e-9)
    gen_busy, gen_how = generation_busy(run_dir, rows, warmup, lo, hi)
    updates = read_jsonl(run_dir / "weight_updates.jsonl")
    return {
        "run_dir": str(run_dir), "steps": len(rows), "warmup_steps": warmup, "window_s": window,
        "wall_time_s": hi,
        "effective_trained_tokens_per_s": sum(r.get("trained_tokens", 0) for r in post) / window,
        "trained_tokens": sum(r.get("trained_tokens", 0) for r in post),
        "step_wall_s": [r.get("step_wall_s") for r in rows],
        "step_wall_s_median": _median([r["step_wall_s"] for r in post if "step_wall_s" in r]),
        "trainer_busy_fraction": covered(trainer_intervals(post), lo, hi) / window,
        "generation_busy_fraction": gen_busy, "generation_busy_measured_by": gen_how,
        "weight_sync_s_median": _median([r["weight_sync_s"] for r in post if "weight_sync_s" in r]),
        "update_pause_s_median": _median([u["pause_total_s"] for u in updates if "pause_total_s" in u]),
        "reward_curve": [r.get("reward_mean") for r in rows],
        "staleness_mean": statistics.fmean(r.get("staleness_mean", 0.0) for r in post),
        "staleness_max": max(r.get("staleness_max", 0) for r in post),
        "trainer_intervals": trainer_intervals(rows),
        "generation_intervals": generation_intervals(run_dir),
    }

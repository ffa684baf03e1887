"""Figures of one finished run, read from its run directory (the contract files only).

Everything after the first ``warmup`` steps: effective trained tokens per second of wall
time, per-step wall time, trainer and generation busy fractions from timestamps, weight-sync
and weight-update pause times, the reward curve (per step and per second of wall time),
staleness and the response length distribution.

``standalone_rates`` reads a *synchronous* run (η = 0), where generation and training take
turns and never overlap, and measures each side alone in trained tokens per second:

* training: trained tokens / trainer-busy seconds, where a step's trainer-busy time is
  ``step_time_s + weight_sync_s`` (metrics.jsonl), summed over the steps after warm-up;
* generation: trained tokens / generation-phase seconds. The generation phase of step k
  runs from the end of step k-1 (``wall_time_s`` of k-1: the new weights are out; no
  prompt of step k starts before they are loaded) to the moment the batch of step k is
  complete: the arrival at the controller of its last group (largest ``done_wall_s`` of the
  trajectories with ``trained_version == k``). Where trajectories carry no timestamps, it is
  the step's wall time minus its trainer-busy time (which then also counts the batch
  transfer to the trainer). Step 0 is never counted (its start includes process start-up).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from areal_cli.rundir import RunDir


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _busy(r: dict) -> float:
    return r.get("step_time_s", 0.0) + r.get("weight_sync_s", 0.0)


def trainer_intervals(rows: list[dict]) -> list[tuple[float, float]]:
    """[start, end] of each step's training + weight sync, ending when the controller saw it."""
    return [(r["wall_time_s"] - _busy(r), r["wall_time_s"]) for r in rows]


def train_step_intervals(rows: list[dict]) -> list[tuple[float, float]]:
    """[start, end] of each step's training alone (the trainer interval less its weight sync)."""
    return [(r["wall_time_s"] - _busy(r), r["wall_time_s"] - r.get("weight_sync_s", 0.0))
            for r in rows]


def weight_sync_intervals(rows: list[dict]) -> list[tuple[float, float]]:
    """[start, end] of each step's weight sync (gather + broadcast), the end of the step."""
    return [(r["wall_time_s"] - r.get("weight_sync_s", 0.0), r["wall_time_s"]) for r in rows]


def generation_intervals(run_dir: Path) -> list[tuple[float, float]]:
    """[start, end] of each trained group's generation, where trajectories carry timestamps
    (``done_wall_s`` and ``gen_time_s``); [] where they do not."""
    seen, out = set(), []
    for t in read_jsonl(RunDir(run_dir).trajectories):
        if t.get("done_wall_s") is None or t.get("gen_time_s") is None or t.get("group_id") in seen:
            continue
        seen.add(t.get("group_id"))
        out.append((t["done_wall_s"] - t["gen_time_s"], t["done_wall_s"]))
    return out


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``intervals`` as disjoint sorted intervals."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


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
    updates = [u for u in read_jsonl(RunDir(run_dir).weight_updates) if "gen_busy_s" in u]
    if updates:  # the engine's own clock: seconds with requests in flight between two updates
        versions = {r["version"] for r in rows[warmup:]}
        workers = {u["worker"] for u in updates}
        busy = sum(u["gen_busy_s"] for u in updates if u["version"] in versions) / len(workers)
        return min(1.0, busy / max(hi - lo, 1e-9)), "engine busy clock"
    return None, "not recorded (the engine and the trajectories carry no generation timestamps)"


def nearest_rank(sorted_xs: list, q: float):
    """The q-quantile (0 < q <= 1) of an ascending list by the nearest-rank method."""
    return sorted_xs[max(0, math.ceil(q * len(sorted_xs)) - 1)]


def response_lengths(run_dir: Path, warmup: int) -> dict:
    """Generated tokens per trained sample (``num_tokens``: the model's tokens, every turn)
    of the steps after warm-up: p10 / p50 / p90 (nearest rank), max, mean, and the fraction
    the engine stopped at the token limit (``finish_reason == "length"``)."""
    rows = [t for t in read_jsonl(RunDir(run_dir).trajectories)
            if t.get("trained_version", warmup) >= warmup and "num_tokens" in t]
    if not rows:
        return {"samples": 0, "p10": None, "p50": None, "p90": None, "max": None, "mean": None,
                "truncated_fraction": None}
    lengths = sorted(int(t["num_tokens"]) for t in rows)
    return {"samples": len(rows), "p10": nearest_rank(lengths, 0.1),
            "p50": nearest_rank(lengths, 0.5),
            "p90": nearest_rank(lengths, 0.9), "max": lengths[-1],
            "mean": statistics.fmean(lengths),
            "truncated_fraction": sum(t.get("finish_reason") == "length" for t in rows) / len(rows)}


def standalone_rates(run_dir: Path, warmup: int) -> dict:
    """Generation alone and training alone, in trained tokens/s, from a synchronous run
    (definitions in the module docstring)."""
    run_dir = Path(run_dir)
    rows = read_jsonl(RunDir(run_dir).metrics)
    post = rows[warmup:]
    busy_s = sum(_busy(r) for r in post)
    train_tokens = sum(r.get("trained_tokens", 0) for r in post)
    batch_done: dict[int, float] = {}  # step → arrival of its batch's last group
    for t in read_jsonl(RunDir(run_dir).trajectories):
        if t.get("done_wall_s") is not None and "trained_version" in t:
            k = t["trained_version"]
            batch_done[k] = max(batch_done.get(k, t["done_wall_s"]), t["done_wall_s"])
    phases, how, gen_tokens = [], set(), 0
    for i in range(max(warmup, 1), len(rows)):
        start, r = rows[i - 1]["wall_time_s"], rows[i]
        end = batch_done.get(r.get("step", i))
        if end is not None and start < end <= r["wall_time_s"]:
            phases.append(end - start)
            how.add("trajectory timestamps: last group's arrival - previous step's end")
        else:
            phases.append(max(0.0, r["wall_time_s"] - start - _busy(r)))
            how.add("step wall time - trainer busy time")
        gen_tokens += r.get("trained_tokens", 0)
    gen_s = sum(phases)
    return {
        "training_trained_tokens_per_s": train_tokens / busy_s if busy_s > 0 else None,
        "generation_trained_tokens_per_s": gen_tokens / gen_s if gen_s > 0 else None,
        "trainer_busy_s": busy_s, "training_steps": len(post),
        "training_trained_tokens": train_tokens,
        "generation_phase_s": gen_s, "generation_steps": len(phases),
        "generation_trained_tokens": gen_tokens,
        "generation_phase_s_per_step": phases,
        "generation_phase_measured_by": " and ".join(sorted(how))
        or "no step after warm-up and step 0",
    }


def generated_in_window(run_dir: Path, lo: float, hi: float) -> int:
    """Model tokens of the samples whose group reached the controller in (lo, hi] (trajectory
    ``done_wall_s``): what generation produced inside the running system over that window."""
    return sum(int(t.get("num_tokens", 0)) for t in read_jsonl(RunDir(run_dir).trajectories)
               if t.get("done_wall_s") is not None and lo < t["done_wall_s"] <= hi)


def summarize_run(run_dir: Path, warmup: int) -> dict:
    run_dir = Path(run_dir)
    rows = read_jsonl(RunDir(run_dir).metrics)
    if len(rows) <= warmup:
        raise ValueError(f"{run_dir}: {len(rows)} steps, not more than the {warmup} warm-up steps; "
                         "raise trainer.steps or lower bench.warmup")
    post = rows[warmup:]
    lo = rows[warmup - 1]["wall_time_s"] if warmup else 0.0
    hi = rows[-1]["wall_time_s"]
    window = max(hi - lo, 1e-9)
    gen_busy, gen_how = generation_busy(run_dir, rows, warmup, lo, hi)
    updates = read_jsonl(RunDir(run_dir).weight_updates)
    return {
        "run_dir": str(run_dir), "steps": len(rows), "warmup_steps": warmup, "window_s": window,
        "window_start_s": lo, "wall_time_s": hi,
        "effective_trained_tokens_per_s": sum(r.get("trained_tokens", 0) for r in post) / window,
        "trained_tokens": sum(r.get("trained_tokens", 0) for r in post),
        "step_wall_s": [r.get("step_wall_s") for r in rows],
        "step_wall_s_median": _median([r["step_wall_s"] for r in post if "step_wall_s" in r]),
        "trainer_busy_fraction": covered(trainer_intervals(post), lo, hi) / window,
        "training_trained_tokens_per_s": (sum(r.get("trained_tokens", 0) for r in post)
                                          / max(sum(_busy(r) for r in post), 1e-9)),
        "generation_busy_fraction": gen_busy, "generation_busy_measured_by": gen_how,
        "generated_tokens_per_s": generated_in_window(run_dir, lo, hi) / window,
        "stale_dropped_tokens_per_s": ((post[-1].get("stale_dropped_tokens", 0)
                                        - (rows[warmup - 1].get("stale_dropped_tokens", 0)
                                           if warmup else 0)) / window),
        # groups generating at once (all workers), as the controller counted them at each step's end
        "running_groups_mean": (statistics.fmean(r["pool_running"] for r in post
                                                 if "pool_running" in r)
                                if any("pool_running" in r for r in post) else None),
        "weight_sync_s_median": _median([r["weight_sync_s"] for r in post if "weight_sync_s" in r]),
        "update_pause_s_median": _median([u["pause_total_s"] for u in updates
                                          if "pause_total_s" in u]),
        "reward_curve": [r.get("reward_mean") for r in rows],
        "reward_wall_s": [r["wall_time_s"] for r in rows],
        "staleness_mean": statistics.fmean(r.get("staleness_mean", 0.0) for r in post),
        "staleness_max": max(r.get("staleness_max", 0) for r in post),
        "response_length": response_lengths(run_dir, warmup),
        # steps that compiled trainer graphs (a form of input the trainer's precompile did not
        # foresee)
        "compiling_steps": {r["step"]: r["compiled_graphs"] for r in rows
                            if r.get("compiled_graphs")},
        "trainer_intervals": trainer_intervals(rows),
        "train_step_intervals": train_step_intervals(rows),
        "weight_sync_intervals": weight_sync_intervals(rows),
        "generation_intervals": generation_intervals(run_dir),
    }


def trailing_means(xs: list[float | None], w: int) -> list[float | None]:
    """Mean of each window of ``w`` steps ending at each step (None before the first full window
    and where a step has no reward)."""
    out: list[float | None] = []
    for i in range(len(xs)):
        window = xs[i - w + 1: i + 1] if i >= w - 1 else []
        out.append(statistics.fmean(window) if window and None not in window else None)
    return out


def reward_reach(sync: dict, asyn: dict) -> dict:
    """When the async run's mean reward first reaches the sync run's final mean reward.

    The sync run's final mean reward is the mean batch reward of its last quarter of steps
    (``window_steps`` of them). The async run reaches it at the end of its first step whose mean
    over the ``window_steps`` steps ending there is at least that; the time is that step's
    ``wall_time_s`` (seconds since the run started, counted the same way in both runs), also as a
    fraction of the sync run's whole wall time. ``heldout_gap_points``: async minus sync held-out
    greedy accuracy, in points, where both were measured; ``heldout_gap_se_points`` its standard
    error over the evaluated problems, which says how large a gap the held-out set can tell from
    none: paired where both evaluations scored the same problems (``heldout_gap_se_paired``; only
    problems one model solves and the other does not count), else as two independent proportions.
    Neither includes the spread between training runs of one configuration."""
    w = max(1, len(sync["reward_curve"]) // 4)
    target = statistics.fmean(x for x in sync["reward_curve"][-w:] if x is not None)
    means = trailing_means(asyn["reward_curve"], w)
    hit = next((i for i, m in enumerate(means) if m is not None and m >= target), None)
    known = [m for m in means if m is not None]
    out = {"window_steps": w, "sync_final_reward": target,
           "async_final_reward": known[-1] if known else None,
           "async_best_reward": max(known) if known else None,
           "reached_at_step": hit,
           "reached_at_s": None if hit is None else asyn["reward_wall_s"][hit],
           "reached_at_fraction_of_sync_wall": None, "heldout_gap_points": None,
           "heldout_gap_se_points": None}
    if hit is not None:
        out["reached_at_fraction_of_sync_wall"] = asyn["reward_wall_s"][hit] / sync["wall_time_s"]
    if "heldout" in sync and "heldout" in asyn:
        a, b = asyn["heldout"], sync["heldout"]
        out["heldout_gap_points"] = 100 * (a["accuracy"] - b["accuracy"])
        paired = heldout_gap_se_paired(a.get("correct"), b.get("correct"))
        if paired is not None:
            out["heldout_gap_se_points"], out["heldout_gap_se_paired"] = paired, True
        elif a.get("problems") and b.get("problems"):
            var = sum(h["accuracy"] * (1 - h["accuracy"]) / h["problems"] for h in (a, b))
            out["heldout_gap_se_points"], out["heldout_gap_se_paired"] = 100 * var ** 0.5, False
    return out


def heldout_gap_se_paired(a: str | None, b: str | None) -> float | None:
    """Standard error, in points, of accuracy(a) - accuracy(b) when both scored the same problems
    in the same order (per-problem "1"/"0" strings): sqrt of the variance of the mean paired
    difference, ((n10 + n01) - (n10 - n01)**2 / n) / n**2. None where they cannot be paired."""
    if not a or not b or len(a) != len(b):
        return None
    n = len(a)
    n10 = sum(x == "1" and y == "0" for x, y in zip(a, b, strict=True))
    n01 = sum(x == "0" and y == "1" for x, y in zip(a, b, strict=True))
    return 100 * max(0.0, (n10 + n01) - (n10 - n01) ** 2 / n) ** 0.5 / n


def reach_lines(reach: dict) -> list[str]:
    """The report's lines on ``reward_reach``."""
    w, target = reach["window_steps"], reach["sync_final_reward"]
    lines = [f"sync final mean reward (its last {w} steps): {target:.3f}"]
    if reach["reached_at_s"] is None:
        lines.append(f"async did not reach it within its steps (its best {w}-step mean "
                     f"{reach['async_best_reward']:.3f}, final {reach['async_final_reward']:.3f})")
    else:
        lines.append(f"async reached it at step {reach['reached_at_step']}, "
                     f"{reach['reached_at_s']:.1f} s = "
                     f"{reach['reached_at_fraction_of_sync_wall']:.2f}x sync's wall time (its "
                     f"final {w}-step mean {reach['async_final_reward']:.3f})")
    if reach["heldout_gap_points"] is not None:
        se = reach.get("heldout_gap_se_points")
        lines.append(f"held-out greedy accuracy, async - sync: {reach['heldout_gap_points']:+.1f} "
                     "points"
                     + (f" (standard error over these problems: {se:.1f} "
                        f"points{', paired' if reach.get('heldout_gap_se_paired') else ''})"
                        if se is not None else ""))
    return lines

"""``areal bench sync-vs-async``: the same workload synchronously (η = 0) and asynchronously (η).

Both runs use one config (conf/ + the overrides) and differ only in ``rollout.max_staleness``.
Written to ``<out>/``: ``sync/`` and ``async/`` (ordinary run directories), ``bench.json``,
``timeline.png`` (trainer and generation busy spans over wall time) and ``reward.png``.

Bench options are overrides too, stripped before composing the run config:
``bench.eta=4`` (default: rollout.max_staleness, or 4 where that is 0), ``bench.warmup=2``
(steps left out of the rates), ``bench.heldout=true`` (greedy accuracy of both final
checkpoints on the task's eval split, ``eval.size`` problems). ``run_dir=`` names ``<out>``.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

BENCH_DEFAULTS = {"eta": None, "warmup": 2, "heldout": True}


def split_overrides(overrides: list[str]) -> tuple[list[str], dict]:
    """(run overrides, bench options) from the command line."""
    run, opts = [], dict(BENCH_DEFAULTS)
    for o in overrides:
        key, _, value = o.partition("=")
        if not key.startswith("bench."):
            run.append(o)
            continue
        name = key.removeprefix("bench.")
        if name not in BENCH_DEFAULTS:
            raise ValueError(f"{key}: unknown bench option; use one of "
                             f"{', '.join('bench.' + k for k in BENCH_DEFAULTS)}")
        opts[name] = value.lower() in ("1", "true", "yes") if name == "heldout" else int(value)
    return run, opts


def run_bench(overrides: list[str]) -> Path:
    from areal_cli.config.load import compose

    run_overrides, opts = split_overrides(list(overrides))
    base = compose(run_overrides)
    eta = opts["eta"] if opts["eta"] is not None else (base.rollout.max_staleness or 4)
    if eta < 1:
        raise ValueError("bench.eta must be at least 1 (η = 0 is the synchronous run it is compared with)")
    out = Path(base.run_dir or f"runs/bench-{_dt.datetime.now():%Y%m%d-%H%M%S}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    modes = {}
    for mode, staleness in (("sync", 0), ("async", eta)):
        run_dir = out / mode
        print(f"== {mode}: rollout.max_staleness={staleness} → {run_dir}", flush=True)
        modes[mode] = run_mode(run_overrides, staleness, run_dir, opts)
    result = compare(modes, eta, opts["warmup"], base)
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    plot(result, out)
    print(report(result), flush=True)
    return out


def run_mode(overrides: list[str], staleness: int, run_dir: Path, opts: dict) -> dict:
    from areal_cli.bench.summary import summarize_run
    from areal_cli.config.load import compose
    from areal_cli.launcher.run import train

    cfg = compose(overrides + [f"rollout.max_staleness={staleness}", f"run_dir={run_dir}"])
    train(cfg, quiet=True)
    summary = summarize_run(run_dir, opts["warmup"])
    summary["max_staleness"] = staleness
    if opts["heldout"]:
        from areal_cli.bench.heldout import greedy_accuracy

        summary["heldout"] = greedy_accuracy(run_dir / "checkpoints" / "final", cfg)
    return summary


def compare(modes: dict, eta: int, warmup: int, cfg) -> dict:
    sync, asyn = modes["sync"], modes["async"]
    speedup = asyn["effective_trained_tokens_per_s"] / max(sync["effective_trained_tokens_per_s"], 1e-9)
    return {
        "eta": eta, "warmup_steps": warmup, "engine": cfg.engine.name, "model": cfg.model,
        "task": cfg.task.name, "steps": cfg.trainer.steps, "batch_size": cfg.trainer.batch_size,
        "group_size": cfg.rollout.group_size, "max_new_tokens": cfg.rollout.max_new_tokens,
        "speedup": speedup,
        "modes": modes,
    }


def report(result: dict) -> str:
    rows = [("effective trained tokens/s", "effective_trained_tokens_per_s", "{:.1f}"),
            ("step wall time, median (s)", "step_wall_s_median", "{:.2f}"),
            ("trainer busy fraction", "trainer_busy_fraction", "{:.2f}"),
            ("generation busy fraction", "generation_busy_fraction", "{:.2f}"),
            ("weight sync, median (s)", "weight_sync_s_median", "{:.3f}"),
            ("update pause, median (s)", "update_pause_s_median", "{:.3f}"),
            ("staleness mean", "staleness_mean", "{:.2f}"),
            ("wall time (s)", "wall_time_s", "{:.1f}")]
    lines = [f"{'':32}{'sync (η=0)':>14}{'async (η=' + str(result['eta']) + ')':>14}"]
    for label, key, fmt in rows:
        cells = [fmt.format(m[key]) if m.get(key) is not None else "—" for m in result["modes"].values()]
        lines.append(f"{label:32}{cells[0]:>14}{cells[1]:>14}")
    for mode in result["modes"].values():
        if "heldout" in mode:
            lines.append(f"held-out greedy accuracy ({mode['max_staleness']}): {mode['heldout']['accuracy']:.3f} "
                         f"on {mode['heldout']['problems']} problems")
    lines.append(f"speedup (effective trained tokens/s, async / sync): {result['speedup']:.2f}x")
    return "\n".join(lines)


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(11, 4.5), sharex=True)
    for ax, (mode, m) in zip(axes, result["modes"].items(), strict=True):
        ax.broken_barh([(a, b - a) for a, b in m["trainer_intervals"]], (10, 8), color="tab:orange",
                       label="trainer (step + weight sync)")
        gen = m["generation_intervals"]
        for i, (a, b) in enumerate(sorted(gen)):
            ax.broken_barh([(a, b - a)], (0 + (i % 4) * 2, 1.8), color="tab:blue",
                           label="generation (a group)" if i == 0 else None)
        ax.set_yticks([4, 14], ["generation", "trainer"])
        ax.set_title(f"{mode} (η={m['max_staleness']}): {m['effective_trained_tokens_per_s']:.0f} trained tokens/s",
                     fontsize=9)
        ax.legend(loc="upper right", fontsize=7)
    axes[-1].set_xlabel("wall time (s)")
    fig.tight_layout()
    fig.savefig(out / "timeline.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for mode, m in result["modes"].items():
        ax.plot(range(len(m["reward_curve"])), m["reward_curve"], label=f"{mode} (η={m['max_staleness']})")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "reward.png", dpi=110)
    plt.close(fig)

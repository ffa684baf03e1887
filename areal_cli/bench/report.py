"""What ``areal bench sync-vs-async`` prints and draws from its result (``sync_vs_async.compare``):
the table with the ideal asynchronous throughput, and the timeline and reward plots."""

from __future__ import annotations

from pathlib import Path

MEASUREMENT_ERROR = 1.02
"""async / ideal above this is reported as a measurement error."""


def step_speedup(sync: dict, asyn: dict) -> float | None:
    a, b = sync.get("step_wall_s_median"), asyn.get("step_wall_s_median")
    return a / b if a and b else None


def _fmt(value, fmt: str) -> str:
    return fmt.format(value) if value is not None else "—"


def _lengths(m: dict) -> str:
    rl = m.get("response_length") or {}
    if not rl.get("samples"):
        return "—"
    return "/".join(str(rl[k]) for k in ("p10", "p50", "p90", "max"))


def report(result: dict) -> str:
    rows = [("effective trained tokens/s", "effective_trained_tokens_per_s", "{:.1f}"),
            ("step wall time, median (s)", "step_wall_s_median", "{:.2f}"),
            ("trainer busy fraction", "trainer_busy_fraction", "{:.2f}"),
            ("trained tokens/s while the trainer is busy", "training_trained_tokens_per_s",
             "{:.1f}"),
            ("generation busy fraction", "generation_busy_fraction", "{:.2f}"),
            ("weight sync, median (s)", "weight_sync_s_median", "{:.3f}"),
            ("update pause, median (s)", "update_pause_s_median", "{:.3f}"),
            ("staleness mean", "staleness_mean", "{:.2f}"),
            ("wall time (s)", "wall_time_s", "{:.1f}")]
    w, cw = 44, 16
    modes = list(result["modes"].values())
    lines = [f"{'':{w}}{'sync (η=0)':>{cw}}{'async (η=' + str(result['eta']) + ')':>{cw}}"]
    for label, key, fmt in rows:
        cells = [_fmt(m.get(key), fmt) for m in modes]
        lines.append(f"{label:{w}}{cells[0]:>{cw}}{cells[1]:>{cw}}")
    cells = [_lengths(m) for m in modes]
    lines.append(f"{'response tokens p10/p50/p90/max':{w}}{cells[0]:>{cw}}{cells[1]:>{cw}}")
    cells = [_fmt((m.get("response_length") or {}).get("truncated_fraction"), "{:.2f}")
             for m in modes]
    lines.append(f"{'truncated at max_new_tokens (' + str(result['max_new_tokens']) + ')':{w}}"
                 f"{cells[0]:>{cw}}{cells[1]:>{cw}}")
    cells = [str(len(m.get("compiling_steps") or {})) for m in modes]
    lines.append(f"{'steps that compiled trainer graphs':{w}}{cells[0]:>{cw}}{cells[1]:>{cw}}")
    lines.extend(ideal_lines(result, w, cw))
    for mode in modes:
        if "heldout" in mode:
            lines.append(f"held-out greedy accuracy ({mode['max_staleness']}): "
                         f"{mode['heldout']['accuracy']:.3f} on {mode['heldout']['problems']} "
                         "problems")
    if result.get("reward_reach"):
        from areal_cli.bench.summary import reach_lines

        lines.extend(reach_lines(result["reward_reach"]))
    lines.append(f"speedup (effective trained tokens/s, async / sync): {result['speedup']:.2f}x")
    if result.get("step_speedup"):
        lines.append("speedup in steps per second (median step time, sync / async): "
                     f"{result['step_speedup']:.2f}x (lower than the token speedup when async "
                     "trains longer responses)")
    return "\n".join(lines)


def ideal_lines(result: dict, w: int, cw: int) -> list[str]:
    """The report's lines on the ideal: both sides alone, async / ideal, in-system generation, the
    split."""
    alone = result.get("standalone") or {}
    lines = [f"{'generation alone (same call), tokens/s':{w}}{'':>{cw}}"
             f"{_fmt(alone.get('generation_trained_tokens_per_s'), '{:.1f}'):>{cw}}",
             f"{'training alone (async batches), tokens/s':{w}}{'':>{cw}}"
             f"{_fmt(alone.get('training_trained_tokens_per_s'), '{:.1f}'):>{cw}}"]
    bound = f"  ({result['ideal_bottleneck']}-bound)" if result.get("ideal_bottleneck") else ""
    lines.append(f"{'ideal async = min of the two, tokens/s':{w}}{'':>{cw}}"
                 f"{_fmt(result.get('ideal_trained_tokens_per_s'), '{:.1f}'):>{cw}}{bound}")
    lines.append(f"{'async / ideal':{w}}{'':>{cw}}"
                 f"{_fmt(result.get('async_vs_ideal'), '{:.2f}'):>{cw}}")
    lines.append(f"{'generation in the system / alone':{w}}{'':>{cw}}"
                 f"{_fmt(result.get('generation_in_system_fraction'), '{:.2f}'):>{cw}}")
    dropped = result.get("generation_in_system_with_dropped_fraction")
    lines.append(f"{'  counting groups dropped as too stale':{w}}{'':>{cw}}"
                 f"{_fmt(dropped, '{:.2f}'):>{cw}}")
    if result.get("generation_in_system_at_load_fraction") is not None:
        label = (f"  / alone at the run's own load ({result['async_running_groups_mean']:.1f} "
                 "groups at once)")
        lines.append(f"{label:{w}}{'':>{cw}}"
                     f"{_fmt(result['generation_in_system_at_load_fraction'], '{:.2f}'):>{cw}}")
        dropped_at_load = result["generation_in_system_with_dropped_at_load_fraction"]
        lines.append(f"{'    counting groups dropped as too stale':{w}}{'':>{cw}}"
                     f"{_fmt(dropped_at_load, '{:.2f}'):>{cw}}")
    if result.get("measurement_error"):
        lines.append(f"MEASUREMENT ERROR: async / ideal = {result['async_vs_ideal']:.2f} > "
                     f"{MEASUREMENT_ERROR}: the async run cannot beat either side alone; the "
                     "standalone rates do not describe that run (other lengths, too few steps, or "
                     "a machine shared with other work)")
    split = result.get("split")
    if split:
        now = split["now"]
        lines.append(f"GPU split from the measured rates: {split['generation_gpus']} generation + "
                     f"{split['trainer_gpus']} trainer (ideal "
                     f"{split['ideal_trained_tokens_per_s']:.0f} tokens/s); this run: "
                     f"{now['generation_gpus']} + {now['trainer_gpus']}")
    return lines


COLOURS = {"generation": "tab:blue", "training": "tab:orange", "weight sync": "tab:red"}


def _model_name(model: str) -> str:
    return Path(str(model)).name or str(model)


def plot(result: dict, out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("no timeline.png or reward.png: they need matplotlib "
              "(pip install 'areal-cli[plots]')", flush=True)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from areal_cli.bench.summary import merge

    fig, axes = plt.subplots(2, 1, figsize=(12, 5), sharex=True)
    for ax, (mode, m) in zip(axes, result["modes"].items(), strict=True):
        gen = merge([tuple(x) for x in m["generation_intervals"]])
        steps = m.get("train_step_intervals") or m["trainer_intervals"]
        syncs = m.get("weight_sync_intervals") or []
        # generation: the union of the groups' spans (any group in flight); white is idle
        ax.broken_barh([(a, b - a) for a, b in gen], (0, 8), facecolor=COLOURS["generation"],
                       linewidth=0)
        ax.broken_barh([(a, b - a) for a, b in steps], (10, 8), facecolor=COLOURS["training"],
                       linewidth=0)
        # a hairline edge keeps sub-pixel weight syncs visible over 100 steps
        ax.broken_barh([(a, b - a) for a, b in syncs], (10, 8), facecolor=COLOURS["weight sync"],
                       edgecolor=COLOURS["weight sync"], linewidth=0.5)
        if not gen:
            ax.text(0.01, 4, "generation spans not recorded (trajectories carry no timestamps)",
                    transform=ax.get_yaxis_transform(), va="center", fontsize=7, color="0.4")
        if m.get("warmup_steps"):
            ax.axvline(m.get("window_start_s", m["trainer_intervals"][m["warmup_steps"] - 1][1]),
                       color="0.3", linestyle="--", linewidth=0.8)
        ax.set_ylim(-1, 19)
        ax.set_yticks([4, 14], ["generation", "trainer"])
        ax.set_title(f"{mode} (η={m['max_staleness']}): {m['effective_trained_tokens_per_s']:.0f} "
                     f"trained tokens/s after warm-up", fontsize=9, loc="left")
        ax.grid(axis="x", color="0.9", linewidth=0.5)
        ax.set_axisbelow(True)
    axes[-1].set_xlabel("wall time (s)")
    handles = [Patch(facecolor=COLOURS["generation"], label="generation (any group in flight)"),
               Patch(facecolor=COLOURS["training"], label="training step"),
               Patch(facecolor=COLOURS["weight sync"], label="weight sync"),
               Patch(facecolor="white", edgecolor="0.5", label="idle"),
               Line2D([], [], color="0.3", linestyle="--", linewidth=0.8, label="end of warm-up")]
    fig.legend(handles=handles, loc="upper right", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(f"{result['task']} · {_model_name(result['model'])} · {result['engine']}",
                 x=0.01, ha="left", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(out / "timeline.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.8))
    for mode, m in result["modes"].items():
        pts = [(t, r) for t,
               r in zip(m.get("reward_wall_s") or [a[1] for a in m["trainer_intervals"]],
                                      m["reward_curve"], strict=True) if r is not None]
        ax.plot([t for t, _ in pts], [r for _, r in pts], marker="o", markersize=3,
                label=f"{mode} (η={m['max_staleness']})")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("mean reward of the batch")
    ax.set_title(f"mean reward vs wall time: {result['task']}, {_model_name(result['model'])}",
                 fontsize=10)
    ax.legend()
    ax.grid(color="0.9", linewidth=0.5)
    fig.tight_layout()
    fig.savefig(out / "reward.png", dpi=110)
    plt.close(fig)

"""``areal plot RUN_DIR [RUN_DIR ...]``: one PNG comparing runs, read from their metrics.jsonl.

Five figures (rows) against step (left) and wall time (right), one colour per run: mean reward of
the batch, mean response length, mean staleness, step time and effective throughput (trained
tokens per second of wall time). Made for an asynchronous against a synchronous run, or two seeds.
"""

from __future__ import annotations

from pathlib import Path

from areal_cli.rundir import RunDir

# (metrics.jsonl key or a function of a row, y label)
PANELS = [
    ("reward_mean", "mean reward"),
    ("response_length_mean", "response length (tokens)"),
    ("staleness_mean", "staleness (versions, mean)"),
    ("step_wall_s", "step time (s)"),
    (lambda r: r.get("trained_tokens", 0) / r["step_wall_s"] if r.get("step_wall_s") else None,
     "throughput (trained tokens/s)"),
]
X_AXES = [("step", "step"), ("wall_time_s", "wall time (s)")]


class NotARun(ValueError):
    pass


def load_run(run_dir: Path) -> tuple[str, list[dict]]:
    """(label, metrics.jsonl rows); the label names the run and its η where config.yaml says it."""
    from areal_cli.durable import TornFile, read_jsonl

    path = RunDir(run_dir).metrics
    if not path.is_file():
        raise NotARun(f"{run_dir}: no metrics.jsonl there; give the run_dir of a run that finished "
                      "a step")
    try:
        rows, _ = read_jsonl(path)  # a torn last line (a run killed mid-write) is left out
    except TornFile as err:
        raise NotARun(str(err)) from None
    if not rows:
        raise NotARun(f"{path} has no steps yet")
    label = Path(run_dir).resolve().name
    eta = _eta(Path(run_dir))
    return (f"{label} (η={eta})" if eta is not None else label), rows


def _eta(run_dir: Path) -> int | None:
    import yaml

    try:
        cfg = yaml.safe_load(RunDir(run_dir).config.read_text())
        return int(cfg["rollout"]["max_staleness"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return None


def _values(rows: list[dict], key) -> list:
    return [key(r) if callable(key) else r.get(key) for r in rows]


def make_figure(runs: list[tuple[str, list[dict]]]):
    """The figure: len(PANELS) rows × (step, wall time) columns, one line per run in each panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(PANELS), len(X_AXES), figsize=(10, 2.1 * len(PANELS)),
                             sharex="col",
                             squeeze=False)
    colours = plt.get_cmap("tab10").colors
    for i, (key, ylabel) in enumerate(PANELS):
        for j, (xkey, xlabel) in enumerate(X_AXES):
            ax = axes[i][j]
            for k, (label, rows) in enumerate(runs):
                pts = [(x, y) for x, y in zip(_values(rows, xkey), _values(rows, key), strict=True)
                       if x is not None and y is not None]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colours[k % len(colours)],
                        linewidth=1.2, marker="o" if len(pts) <= 40 else None, markersize=2.5,
                        label=label)
            ax.set_ylabel(ylabel if j == 0 else "", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(color="0.9", linewidth=0.5)
            if i == len(PANELS) - 1:
                ax.set_xlabel(xlabel, fontsize=8)
            if xkey == "step":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(runs), 3), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.25 / (2.1 * len(PANELS))))
    return fig


def plot_runs(run_dirs: list[Path], out: Path | None = None) -> Path:
    """Write the comparison PNG (default: plot.png in the first run directory); returns its path."""
    import matplotlib.pyplot as plt

    runs = [load_run(Path(d)) for d in run_dirs]
    out = Path(out) if out else RunDir(run_dirs[0]).plot
    fig = make_figure(runs)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out

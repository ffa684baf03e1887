"""``areal plot`` on two real runs (synchronous and asynchronous), and ``areal status``."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import AREAL, ROOT, TINY_RUN, read_jsonl, run_train

from areal_cli.launcher.status import sparkline
from areal_cli.tracking.plot import PANELS, load_run, make_figure


@pytest.fixture(scope="module")
def two_runs(tiny_model, tmp_path_factory):
    runs = []
    for eta in (0, 2):
        run_dir = tmp_path_factory.mktemp(f"eta{eta}")
        run_train(run_dir, f"model={tiny_model}", *TINY_RUN, "trainer.steps=3",
                  f"rollout.max_staleness={eta}",
                  "logging.backends=[jsonl]")
        runs.append(run_dir)
    return runs


@pytest.mark.slow  # two whole runs (50 s on 2 cores): `make test-slow`, which CI runs too
def test_plot_writes_a_png_with_one_line_per_run_in_every_panel(two_runs, tmp_path):
    out = tmp_path / "compare.png"
    proc = subprocess.run(AREAL + ["plot", *map(str, two_runs), "--out", str(out)],
                          capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    import matplotlib.image

    assert matplotlib.image.imread(out).shape[:2] == (1050, 1000)

    fig = make_figure([load_run(d) for d in two_runs])
    axes = fig.get_axes()
    assert len(axes) == 2 * len(PANELS)
    assert [axes[2 * i].get_ylabel() for i in range(len(PANELS))] == [label for _, label in PANELS]
    assert (axes[-2].get_xlabel(), axes[-1].get_xlabel()) == ("step", "wall time (s)")
    for ax in axes:
        assert [line.get_label().split(" ")[1] for line in ax.get_lines()] == ["(η=0)", "(η=2)"]
    for line, run_dir in zip(axes[0].get_lines(), two_runs, strict=True):  # reward against step
        rows = read_jsonl(run_dir / "metrics.jsonl")
        assert list(line.get_xdata()) == [0, 1, 2]
        assert list(line.get_ydata()) == [r["reward_mean"] for r in rows]
    wall = axes[1].get_lines()[1]
    assert list(wall.get_xdata()) == [r["wall_time_s"]
                                      for r in read_jsonl(two_runs[1] / "metrics.jsonl")]


def test_plot_of_a_directory_that_is_no_run_exits_2(tmp_path):
    proc = subprocess.run(AREAL + ["plot", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)
    assert (proc.returncode == 2 and "no metrics.jsonl" in proc.stderr
            and "Traceback" not in proc.stderr)


@pytest.mark.slow  # two whole runs (50 s on 2 cores): `make test-slow`, which CI runs too
def test_status_shows_key_figures_and_the_reward_sparkline(two_runs):
    proc = subprocess.run(AREAL + ["status", str(two_runs[1])], capture_output=True, text=True,
                          cwd=ROOT,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    figures = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1)
                   for line in proc.stdout.splitlines()
                   if re.match(r"^[a-z/ ]+?\s{2,}\S", line))
    assert figures["step"] == "3/3" and figures["staleness"].startswith("max ")
    assert "trackers" in figures["step time"] and "gen" in figures["tokens/s"]
    spark = figures["reward/step"].split()[0]
    assert len(spark) == 3 and set(spark) <= set("▁▂▃▄▅▆▇█")


def test_sparkline():
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([0.5, 0.5]) == "▁▁"
    assert sparkline(list(range(120)), width=60) == sparkline([i * 2 + 0.5 for i in range(60)])

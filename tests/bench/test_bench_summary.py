"""``areal bench sync-vs-async`` figures on synthetic run directories (fast, no processes):
standalone rates, the ideal asynchronous throughput, response lengths, the table and plots."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from areal_cli.bench.alone import pick_split
from areal_cli.bench.report import plot, report
from areal_cli.bench.summary import (
    merge,
    nearest_rank,
    reach_lines,
    response_lengths,
    reward_reach,
    standalone_rates,
    summarize_run,
    trailing_means,
)
from areal_cli.bench.sync_vs_async import compare

# generation alone, one CPU worker
CPU_ALONE = {"generated_tokens_per_s": 100.0, "scale": 1, "gpus_per_worker": 0}

TOKENS = 100  # trained tokens per step
LENGTHS = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]  # num_tokens of the 10 samples of a step
MAX_NEW = 100
CFG = SimpleNamespace(engine=SimpleNamespace(name="hf",
                                           vllm=SimpleNamespace(tensor_parallel_size=1)),
                      model="/models/tiny-smollm2",
                      task=SimpleNamespace(name="basic_arithmetic"),
                      trainer=SimpleNamespace(steps=5, batch_size=2, ranks=2),
                      rollout=SimpleNamespace(group_size=5, max_new_tokens=MAX_NEW))


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(run_dir: Path, steps: int, gen_s: float, transfer_s: float, train_s: float, sync_s: float,
         overlap: bool, timestamps: bool = True) -> Path:
    """A run of ``steps`` steps. Sync (overlap=False): generation (gen_s), batch transfer,
    training, weight sync, one after the other; async: a step every train_s + sync_s."""
    run_dir.mkdir(parents=True)
    metrics, trajs, t = [], [], 5.0  # step 0 starts after 5 s of start-up
    for k in range(steps):
        start = t
        batch_done = start + (0.0 if overlap else gen_s)
        t = batch_done + transfer_s + train_s + sync_s
        metrics.append({"step": k, "version": k + 1, "reward_mean": 0.1 * k,
                        "trained_tokens": TOKENS,
                        "step_time_s": train_s, "weight_sync_s": sync_s, "wall_time_s": t,
                        "step_wall_s": t - start, "staleness_mean": 0.0 if not overlap else 1.0,
                        "staleness_max": 0 if not overlap else 1})
        for i, n in enumerate(LENGTHS):
            g = 2 * k + (i // 5)
            # the second group of the batch finishes last
            done = batch_done - (0.5 if i < 5 else 0.0)
            row = {"group_id": g, "trained_version": k, "num_tokens": n,
                   "finish_reason": "length" if n == MAX_NEW else "stop", "reward": 0.1 * k}
            if timestamps:
                row.update(done_wall_s=done, gen_time_s=gen_s - (0.5 if i < 5 else 0.0))
            trajs.append(row)
    _write(run_dir / "metrics.jsonl", metrics)
    _write(run_dir / "trajectories.jsonl", trajs)
    _write(run_dir / "weight_updates.jsonl",
           [{"worker": "rollout-0", "version": k + 1, "pause_total_s": 0.05} for k in range(steps)])
    return run_dir


def _modes(tmp_path: Path, timestamps: bool = True, warmup: int = 1) -> dict:
    sync = _run(tmp_path / "sync", 5, gen_s=2.0, transfer_s=0.1, train_s=1.0, sync_s=0.2,
                overlap=False,
                timestamps=timestamps)
    asyn = _run(tmp_path / "async", 5, gen_s=2.0, transfer_s=0.0, train_s=1.0, sync_s=0.2,
                overlap=True,
                timestamps=timestamps)
    modes = {"sync": summarize_run(sync, warmup), "async": summarize_run(asyn, warmup)}
    modes["sync"]["max_staleness"], modes["async"]["max_staleness"] = 0, 1
    return modes


def test_groups_dropped_as_too_stale_count_as_generated_in_the_second_fraction_only(tmp_path):
    modes = _modes(tmp_path)
    plain = compare(modes, eta=1, warmup=1, cfg=CFG, alone=CPU_ALONE)
    assert plain["generation_in_system_with_dropped_fraction"] == pytest.approx(
        plain["generation_in_system_fraction"])  # nothing dropped
    run = Path(modes["async"]["run_dir"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # cumulative, as the controller writes it: 240 tokens dropped at each step from step 2
    for r in rows:
        r["stale_dropped_tokens"] = 240 * max(0, r["step"] - 1)
    _write(run / "metrics.jsonl", rows)
    modes["async"] = summarize_run(run, 1)
    got = compare(modes, eta=1, warmup=1, cfg=CFG, alone=CPU_ALONE)
    # steps 1..4 after the warm-up step 0: 3 × 240 tokens dropped in the 4.8 s window
    assert modes["async"]["stale_dropped_tokens_per_s"] == pytest.approx(3 * 240 / 4.8)
    assert (got["generation_in_system_fraction"]
            == pytest.approx(plain["generation_in_system_fraction"]))
    assert got["generation_in_system_with_dropped_fraction"] == pytest.approx(
        (3 * 550 + 3 * 240) / 4.8 / 100.0)
    assert "counting groups dropped as too stale" in report(got)


def test_in_system_generation_is_also_set_against_the_engine_alone_at_the_runs_own_load(tmp_path):
    modes = _modes(tmp_path)
    run = Path(modes["async"]["run_dir"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:  # the controller's count of groups generating at each step's end
        r["pool_running"] = 3 if r["step"] % 2 else 2
    _write(run / "metrics.jsonl", rows)
    modes["async"] = summarize_run(run, 1)
    # steps 1..4 after the warm-up step
    assert modes["async"]["running_groups_mean"] == pytest.approx(2.5)
    plain = compare(modes, eta=1, warmup=1, cfg=CFG, alone=CPU_ALONE)
    assert (plain["generation_in_system_at_load_fraction"] is None
            and "own load" not in report(plain))
    alone = {**CPU_ALONE,
             "at_async_load": {"generated_tokens_per_s": 50.0, "concurrency_groups": 2}}
    got = compare(modes, eta=1, warmup=1, cfg=CFG, alone=alone)
    assert (got["generation_in_system_at_load_fraction"]
            == pytest.approx(2 * got["generation_in_system_fraction"]))
    assert got["generation_in_system_with_dropped_at_load_fraction"] == pytest.approx(
        2 * got["generation_in_system_with_dropped_fraction"])
    # the ideal stays the bound
    assert got["ideal_trained_tokens_per_s"] == plain["ideal_trained_tokens_per_s"]
    assert "alone at the run's own load (2.5 groups at once)" in report(got)


def test_nearest_rank_and_merge():
    xs = list(range(1, 11))
    assert [nearest_rank(xs, q) for q in (0.1, 0.5, 0.9, 1.0)] == [1, 5, 9, 10]
    assert nearest_rank([7], 0.1) == 7
    assert merge([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]


def test_standalone_rates_from_trajectory_timestamps(tmp_path):
    run = _run(tmp_path / "sync", 5, gen_s=2.0, transfer_s=0.1, train_s=1.0, sync_s=0.2,
               overlap=False)
    st = standalone_rates(run, warmup=1)
    # training alone: 100 tokens per 1.2 s of step + weight sync; steps 1..4
    assert st["training_trained_tokens_per_s"] == pytest.approx(TOKENS / 1.2)
    assert st["training_steps"] == 4
    # generation alone: previous step's end → last group's arrival = 2.0 s per step
    assert st["generation_phase_s_per_step"] == pytest.approx([2.0] * 4)
    assert st["generation_trained_tokens_per_s"] == pytest.approx(TOKENS / 2.0)
    assert st["generation_phase_measured_by"].startswith("trajectory timestamps")


def test_standalone_rates_without_timestamps_and_step0(tmp_path):
    run = _run(tmp_path / "sync", 5, gen_s=2.0, transfer_s=0.1, train_s=1.0, sync_s=0.2,
               overlap=False,
               timestamps=False)
    st = standalone_rates(run, warmup=0)
    # step 0 (start-up) never counts for generation; the phase then includes the batch transfer
    assert st["generation_steps"] == 4 and st["training_steps"] == 5
    assert st["generation_phase_s_per_step"] == pytest.approx([2.1] * 4)
    assert st["generation_phase_measured_by"] == "step wall time - trainer busy time"


def test_response_lengths(tmp_path):
    run = _run(tmp_path / "sync", 3, gen_s=2.0, transfer_s=0.1, train_s=1.0, sync_s=0.2,
               overlap=False)
    rl = response_lengths(run, warmup=1)
    assert rl == {"samples": 20, "p10": 10, "p50": 50, "p90": 90, "max": 100, "mean": 55.0,
                  "truncated_fraction": 0.1}
    assert response_lengths(tmp_path / "missing", 0)["samples"] == 0


def test_compare_ideal_and_bench_json(tmp_path):
    modes = _modes(tmp_path)
    result = compare(modes, eta=1, warmup=1, cfg=CFG, alone=CPU_ALONE)
    json.dumps(result)  # bench.json is plain JSON
    # training alone: the async run's batches, TOKENS per 1.0 s step + 0.2 s weight sync
    assert result["standalone"]["training_trained_tokens_per_s"] == pytest.approx(TOKENS / 1.2)
    # measured alone
    assert result["standalone"]["generation_trained_tokens_per_s"] == pytest.approx(100.0)
    assert result["ideal_trained_tokens_per_s"] == pytest.approx(TOKENS / 1.2)
    assert result["ideal_bottleneck"] == "training"
    # async: a step every 1.2 s → 83.3 tokens/s: exactly the training-bound ideal
    assert modes["async"]["effective_trained_tokens_per_s"] == pytest.approx(TOKENS / 1.2)
    assert result["async_vs_ideal"] == pytest.approx(1.0) and not result["measurement_error"]
    # in the system: groups of steps 2..4 arrive inside the window (6.2, 11.0]: 3 × 550 tokens in
    # 4.8 s
    assert modes["async"]["generated_tokens_per_s"] == pytest.approx(3 * 550 / 4.8)
    assert result["generation_in_system_fraction"] == pytest.approx(3 * 550 / 4.8 / 100.0)
    assert result["split"] is None  # the CPU: no GPUs to split
    # kept, not a bound
    assert result["sync_phases"]["generation_trained_tokens_per_s"] == pytest.approx(50.0)
    assert result["reward_reach"]["reached_at_step"] == 4  # both runs: reward 0.1 * step
    for key in ("ideal_trained_tokens_per_s", "async_vs_ideal", "response_length", "reward_reach",
                "split",
                "standalone.generation_trained_tokens_per_s",
                "standalone.training_trained_tokens_per_s",
                "generation_in_system_fraction", "sync_phases"):
        assert key in result["definitions"]
    for m in modes.values():
        rl = m["response_length"]
        assert 0 < rl["p10"] <= rl["p50"] <= rl["p90"] <= rl["max"] <= MAX_NEW
        assert rl["truncated_fraction"] == pytest.approx(0.1)
        assert m["reward_wall_s"] == [r[1] for r in m["trainer_intervals"]]
        assert all(b - a == pytest.approx(0.2) for a, b in m["weight_sync_intervals"])
    sync_step, async_step = (modes["sync"]["step_wall_s_median"],
                             modes["async"]["step_wall_s_median"])
    assert (result["step_speedup"] == pytest.approx(sync_step / async_step)
            and "step_speedup" in result["definitions"])
    table = report(result)
    assert "MEASUREMENT ERROR" not in table
    for text in ("generation alone", "training alone", "ideal async", "async / ideal",
                 "steps per second",
                 "generation in the system / alone",
                 "response tokens p10/p50/p90/max", "10/50/90/100", "truncated at max_new_tokens",
                 "sync final mean reward", "async reached it at step 4"):
        assert text in table


def test_async_above_the_ideal_is_a_measurement_error(tmp_path):
    # generation alone slower than the async run itself
    slow = dict(CPU_ALONE, generated_tokens_per_s=50.0)
    result = compare(_modes(tmp_path), eta=1, warmup=1, cfg=CFG, alone=slow)
    assert (result["async_vs_ideal"] == pytest.approx((TOKENS / 1.2) / 50.0)
            and result["measurement_error"])
    assert "MEASUREMENT ERROR: async / ideal = 1.67 > 1.02" in report(result)


def test_gpu_split_is_picked_from_the_per_gpu_rates(tmp_path):
    # 100 tokens/s per generation GPU, 60 per trainer GPU, 4 GPUs: 1+3 → 100, 2+2 → min(200, 120) =
    # 120, 3+1 → 60
    assert pick_split(100.0, 60.0, 4, 1) == {"generation_gpus": 2, "trainer_gpus": 2,
                                             "ideal_trained_tokens_per_s": 120.0}
    assert pick_split(100.0, 20.0, 4, 1)["generation_gpus"] == 1  # a slow trainer takes 3
    assert pick_split(100.0, 60.0, 4, 2)["generation_gpus"] == 2  # TP 2: generation in pairs
    assert pick_split(100.0, 60.0, 1, 1) is None
    # two workers of one GPU each, 2 trainer ranks
    gpus = dict(CPU_ALONE, scale=2, gpus_per_worker=1)
    split = compare(_modes(tmp_path), eta=1, warmup=1, cfg=CFG, alone=gpus)["split"]
    # generation 200 tokens/s over 2 GPUs, training 83.3 over 2: 1 + 3 gives min(100, 125) = 100
    assert split["generation_gpus"] == 1 and split["now"] == {"generation_gpus": 2,
                                                              "trainer_gpus": 2}
    assert split["ideal_trained_tokens_per_s"] == pytest.approx(100.0)


def test_plots_written(tmp_path):
    for timestamps in (True, False):
        out = tmp_path / f"out-{timestamps}"
        result = compare(_modes(out, timestamps=timestamps), eta=1, warmup=1, cfg=CFG,
                         alone=CPU_ALONE)
        plot(result, out)
        assert (out / "timeline.png").stat().st_size > 0 and (out / "reward.png").stat().st_size > 0


def test_reward_plot_is_against_wall_time(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = compare(_modes(tmp_path), eta=1, warmup=1, cfg=CFG)
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figures open to inspect them
    plot(result, tmp_path)
    monkeypatch.undo()
    timeline, reward = figures
    ax = reward.axes[0]
    assert ax.get_xlabel() == "wall time (s)" and ax.get_ylabel() == "mean reward of the batch"
    assert "basic_arithmetic" in ax.get_title() and "tiny-smollm2" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["sync (η=0)", "async (η=1)"]
    xs = ax.get_lines()[0].get_xdata()
    assert list(xs) == result["modes"]["sync"]["reward_wall_s"]
    labels = [t.get_text() for t in timeline.legends[0].get_texts()]
    assert {"training step", "weight sync", "idle"} <= set(labels)
    assert any(lbl.startswith("generation") for lbl in labels)
    assert timeline.axes[-1].get_xlabel() == "wall time (s)"
    for fig in figures:
        plt.close(fig)


def _curve(rewards: list[float], step_s: float) -> dict:
    return {"reward_curve": rewards,
            "reward_wall_s": [step_s * (k + 1) for k in range(len(rewards))],
            "wall_time_s": step_s * len(rewards)}


def test_trailing_means():
    assert trailing_means([1.0, 2.0, 3.0, None, 5.0], 2) == [None, 1.5, 2.5, None, None]


def test_reward_reach_when_and_when_not():
    sync = _curve([0.0, 0.2, 0.4, 0.6, 0.6, 0.8, 0.8, 0.8], step_s=10.0)  # last quarter: 0.8
    sync["heldout"] = {"accuracy": 0.40, "problems": 1000}
    # async: twice as fast per step, one step behind; reaches a 2-step mean of 0.8 at its step 7
    asyn = _curve([0.0, 0.0, 0.2, 0.4, 0.6, 0.6, 0.8, 0.8], step_s=5.0)
    asyn["heldout"] = {"accuracy": 0.42, "problems": 1000}
    r = reward_reach(sync, asyn)
    assert r["window_steps"] == 2 and r["sync_final_reward"] == pytest.approx(0.8)
    assert r["reached_at_step"] == 7 and r["reached_at_s"] == pytest.approx(40.0)
    assert r["reached_at_fraction_of_sync_wall"] == pytest.approx(0.5)
    assert r["heldout_gap_points"] == pytest.approx(2.0)
    # two independent proportions of 1,000 problems each: sqrt(.4 * .6 / 1000 + .42 * .58 / 1000)
    assert r["heldout_gap_se_points"] == pytest.approx(2.199, abs=1e-3)
    assert "0.50x sync's wall time" in "\n".join(reach_lines(r))
    assert r["heldout_gap_se_paired"] is False
    assert "standard error over these problems: 2.2 points)" in "\n".join(reach_lines(r))
    # the same problems scored one by one: only the problems the two disagree on count
    sync["heldout"]["correct"], asyn["heldout"]["correct"] = "1100" * 250, "1010" * 250
    r = reward_reach(sync, asyn)
    # n10 = n01 = 250 of 1,000: sqrt(500 - 0) / 1000 = 2.236 points; then async solves 250 problems
    # sync does not and sync 230 async does not: sqrt((250 + 230) - 20**2 / 1000) / 1000
    assert r["heldout_gap_se_paired"] is True and r["heldout_gap_se_points"] == pytest.approx(2.236,
                                                                                              abs=1e-3)
    assert "points, paired)" in "\n".join(reach_lines(r))
    asyn["heldout"]["correct"] = "1110" * 20 + "1010" * 230
    assert (reward_reach(sync, asyn)["heldout_gap_se_points"]
            == pytest.approx(100 * (480 - 0.4) ** 0.5 / 1000))
    # models that agree on every problem but one: a far smaller error than two independent sets
    asyn["heldout"]["correct"] = "0" + sync["heldout"]["correct"][1:]
    assert (reward_reach(sync, asyn)["heldout_gap_se_points"]
            == pytest.approx(100 * (1 - 1 / 1000) ** 0.5 / 1000))
    # one batch at the target is not enough: the window's mean must reach it
    slow = _curve([0.0, 0.0, 0.2, 0.4, 0.6, 0.6, 0.6, 0.8], step_s=5.0)
    r = reward_reach(sync, slow)
    assert r["reached_at_s"] is None and r["async_best_reward"] == pytest.approx(0.7)
    assert r["heldout_gap_points"] is None
    assert "did not reach it" in "\n".join(reach_lines(r))


def test_steps_that_compiled_trainer_graphs_are_kept_with_their_graph_count(tmp_path):
    run = _run(tmp_path / "sync", 4, gen_s=2.0, transfer_s=0.1, train_s=1.0, sync_s=0.2,
               overlap=False)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r["compiled_graphs"] = 56 if r["step"] == 2 else 0
    _write(run / "metrics.jsonl", rows)
    modes = _modes(tmp_path / "both")
    modes["sync"] = summarize_run(run, 1)
    assert modes["sync"]["compiling_steps"] == {2: 56} and modes["async"]["compiling_steps"] == {}
    table = report(compare(modes, eta=1, warmup=1, cfg=CFG, alone=CPU_ALONE))
    assert [line.split()[-2:] for line in table.splitlines()
            if "compiled trainer graphs" in line] == [["1", "0"]]

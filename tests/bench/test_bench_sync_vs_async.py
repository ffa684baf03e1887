"""``areal bench sync-vs-async`` end to end on the CPU (slow): both modes run, bench.json has both,
with the ideal asynchronous throughput and the response lengths. Fast checks of the same
figures on synthetic run directories: test_bench_summary.py."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_RUN

from areal_cli.bench.summary import covered
from areal_cli.bench.sync_vs_async import split_overrides


def test_covered_merges_overlaps():
    # [0,2] ∪ [1,3] ∪ [5,6] inside [0.5, 5.5] covers 0.5..3 (2.5 s) and 5..5.5 (0.5 s)
    assert covered([(1, 3), (0, 2), (5, 6)], 0.5, 5.5) == 3.0


def test_bench_options_are_stripped():
    run, opts = split_overrides(["trainer.steps=3", "bench.eta=2", "bench.heldout=false"])
    assert run == ["trainer.steps=3"]
    assert opts == {"eta": 2, "warmup": 2, "heldout": False, "heldout_size": 1000, "alone": True,
                    "alone_groups": 0, "modes": "sync,async"}
    assert split_overrides(["bench.modes=async,sync"])[1]["modes"] == "sync,async"
    with pytest.raises(ValueError, match="bench.modes=both"):
        split_overrides(["bench.modes=both"])


def test_a_finished_mode_is_kept_only_for_the_same_command(tmp_path):
    from areal_cli.bench.sync_vs_async import kept_mode

    _, opts = split_overrides(["bench.heldout=false"])
    (tmp_path / "sync").mkdir()
    (tmp_path / "sync" / "metrics.jsonl").write_text("{}\n")
    record = {"overrides": ["trainer.steps=3"], "staleness": 0,
              "options": {"warmup": 2, "heldout": False, "heldout_size": 1000},
              "summary": {"steps": 3}}
    (tmp_path / "sync.json").write_text(json.dumps(record))
    assert kept_mode(tmp_path, "sync", ["trainer.steps=3"], 0, opts) == {"steps": 3}
    # another warm-up changes the figures: measured again, the record dropped
    _, other = split_overrides(["bench.heldout=false", "bench.warmup=1"])
    assert kept_mode(tmp_path, "sync", ["trainer.steps=3"], 0, other) is None
    assert not (tmp_path / "sync.json").exists()
    (tmp_path / "sync.json").write_text(json.dumps(record))
    assert kept_mode(tmp_path, "sync", ["trainer.steps=4"], 0, opts) is None
    assert kept_mode(tmp_path, "async", ["trainer.steps=3"], 1, opts) is None  # never recorded


def test_generation_alone_is_kept_only_for_the_run_it_measured(tmp_path):
    from areal_cli.bench.sync_vs_async import _kept_alone

    of = {"run_dir": str(tmp_path / "async"), "groups": 8, "load": 3, "run_finished": 1.5}
    path = tmp_path / "generation_alone.json"
    assert _kept_alone(path, of) is None  # none yet
    path.write_text(json.dumps({"generated_tokens_per_s": 10.0, "of": of}))
    assert _kept_alone(path, of)["generated_tokens_per_s"] == 10.0
    # the async run measured again (it finished later), or other groups asked: measured anew
    assert _kept_alone(path, {**of, "run_finished": 2.5}) is None
    assert _kept_alone(path, {**of, "groups": 16}) is None
    path.write_text("{not json")
    assert _kept_alone(path, of) is None


@pytest.mark.slow
def test_bench_runs_one_mode_per_call_and_compares_when_both_are_done(tiny_model, tmp_path):
    from areal_cli.bench.sync_vs_async import run_bench

    args = [f"model={tiny_model}", *TINY_RUN, f"run_dir={tmp_path}", "trainer.steps=3",
            "bench.warmup=1", "bench.eta=1", "bench.heldout=false", "bench.alone=false"]
    run_bench([*args, "bench.modes=sync"])
    assert (tmp_path / "sync.json").is_file() and not (tmp_path / "async").exists()
    assert not (tmp_path / "bench.json").exists()
    sync_metrics = (tmp_path / "sync" / "metrics.jsonl").read_bytes()
    (tmp_path / "async").mkdir()  # a run stopped before its end
    run_bench([*args, "bench.modes=async"])
    assert (tmp_path / "sync" / "metrics.jsonl").read_bytes() == sync_metrics  # kept, not re-run
    assert list(tmp_path.glob("async.unfinished-*"))
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert set(bench["modes"]) == {"sync", "async"} and bench["speedup"] > 0


@pytest.mark.slow
def test_bench_writes_both_modes(tiny_model, tmp_path):
    from areal_cli.bench.sync_vs_async import run_bench

    out = run_bench([f"model={tiny_model}", *TINY_RUN, f"run_dir={tmp_path}", "trainer.steps=3",
                     "bench.warmup=1", "bench.eta=1", "eval.size=4", "task.eval_size=4",
                     "bench.heldout_size=6", "bench.alone_groups=8"])
    bench = json.loads((out / "bench.json").read_text())
    assert set(bench["modes"]) == {"sync", "async"}
    assert (bench["modes"]["sync"]["max_staleness"] == 0
            and bench["modes"]["async"]["max_staleness"] == 1)
    for m in bench["modes"].values():
        assert m["effective_trained_tokens_per_s"] > 0
        assert 0 < m["trainer_busy_fraction"] <= 1
        assert len(m["reward_curve"]) == 3
        # bench.heldout_size widens the eval split beyond its 4
        assert m["heldout"]["problems"] == 6
    assert bench["speedup"] > 0
    max_new = bench["max_new_tokens"]
    for m in bench["modes"].values():
        rl = m["response_length"]
        assert rl["samples"] == 2 * 2 * 2  # 2 steps after warm-up × B = 2 × G = 2
        assert 0 < rl["p10"] <= rl["p50"] <= rl["p90"] <= rl["max"] <= max_new
        assert 0 <= rl["truncated_fraction"] <= 1
        assert len(m["reward_wall_s"]) == 3
    alone = bench["standalone"]
    assert (alone["generation_trained_tokens_per_s"] > 0
            and alone["training_trained_tokens_per_s"] > 0)
    # the engine alone at the async run's concurrency, in this call
    measured = alone["generation_alone"]
    from areal_cli.config.schema import worker_concurrency
    from areal_cli.runconfig.compose import load_yaml

    in_async = worker_concurrency(load_yaml(out / "async" / "config.yaml", check=False))
    assert measured["groups"] == 8 and measured["concurrency_groups"] == in_async
    load = round(bench["async_running_groups_mean"])  # one worker
    if 0 < load < in_async:  # measured first at the load the async run had, in the same engine
        assert measured["at_async_load"]["concurrency_groups"] == load
        assert bench["generation_in_system_at_load_fraction"] > 0
    assert (out / "generation_alone.json").is_file()
    assert bench["sync_phases"]["generation_phase_measured_by"].startswith("trajectory timestamps")
    assert bench["ideal_trained_tokens_per_s"] == min(alone["generation_trained_tokens_per_s"],
                                                      alone["training_trained_tokens_per_s"])
    assert bench["async_vs_ideal"] > 0 and 0 < bench["generation_in_system_fraction"]
    assert {"ideal_trained_tokens_per_s", "async_vs_ideal",
            "response_length"} <= set(bench["definitions"])
    assert (out / "timeline.png").stat().st_size > 0 and (out / "reward.png").stat().st_size > 0
    assert (out / "curves.png").stat().st_size > 0
    # the same command again: both modes and generation alone are kept, the comparison redone
    kept = (out / "generation_alone.json").read_bytes()
    run_bench([f"model={tiny_model}", *TINY_RUN, f"run_dir={tmp_path}", "trainer.steps=3",
               "bench.warmup=1", "bench.eta=1", "eval.size=4", "task.eval_size=4",
               "bench.heldout_size=6", "bench.alone_groups=8"])
    assert (out / "generation_alone.json").read_bytes() == kept
    again = json.loads((out / "bench.json").read_text())
    assert again["ideal_trained_tokens_per_s"] == bench["ideal_trained_tokens_per_s"]

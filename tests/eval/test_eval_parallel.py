"""Data-parallel `areal eval` (workers=N / gpus=[...]): shards merged into the one-process result,
a dead worker named, and the engine=vllm / gpus checks that run before any model loads."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from areal_cli.eval.parallel import merge, shard, shard_bounds

AREAL = [sys.executable, "-m", "areal_cli.cli", "eval"]
ENV = {**os.environ, "COLUMNS": "400", "TOKENIZERS_PARALLELISM": "false"}


def run_eval(*args, env=None, timeout=300):
    return subprocess.run(AREAL + list(args), capture_output=True, text=True, env=env or ENV,
                          timeout=timeout)


def table(stdout: str) -> list[str]:
    """The table's body rows without the time column."""
    return [line.rsplit("│", 2)[0] for line in stdout.splitlines() if line.startswith("│")]


@pytest.mark.slow  # a whole run (30-60 s on 2 cores): `make test-slow`, which CI runs too
def test_two_cpu_workers_give_the_one_process_result(tmp_path):
    """SmolLM2-135M-Instruct, greedy, 2 tasks × 3 problems: 2 workers (shards of 1 and 2 problems
    per task) merge into exactly the samples and metrics of one process. float32, because bf16
    argmax can flip at a near-tie when the batch composition changes (as with max_concurrent)."""
    common = ["tasks=[basic_arithmetic,chain_sum]", "size=3", "max_new_tokens=12",
              "reward.workers=1",
              "engine.dtype=float32"]
    one = run_eval(*common, f"out_dir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_eval(*common, "workers=2", f"out_dir={tmp_path / 'two'}")
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = (json.loads((tmp_path / d / "eval.json").read_text()) for d in ("one", "two"))
    assert a["run"]["workers"] == 1 and b["run"]["workers"] == 2

    def strip(data):
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in data["results"]]

    assert strip(a) == strip(b)
    assert [r["task"] for r in b["results"]] == ["basic_arithmetic", "chain_sum"]
    for r in b["results"]:
        assert [s["prompt_id"] for s in r["samples"]] == [f"{r['task']}/eval/{i}" for i in range(3)]
        assert r["metrics"]["problems"] == 3 and "accuracy" in r["metrics"]
    assert table(one.stdout) == table(two.stdout) and len(table(two.stdout)) == 2
    for k in (0, 1):
        shard_file = json.loads((tmp_path / "two" / "shards" / f"shard-{k}.json").read_text())
        assert [len(r["samples"]) for r in shard_file["results"]] == [k + 1, k + 1]  # 3 = 1 + 2
        assert (tmp_path / "two" / "shards" / f"shard-{k}.log").read_text()
    assert "[shard 1]" in two.stderr


def test_a_dead_worker_is_named_and_stops_the_run(tiny_model, tmp_path):
    """Shard 1 exits at start (fault injection): exit 1 at once, naming the shard and its log."""
    env = {**ENV, "AREAL_FAULT": "eval@1", "AREAL_FAULT_MODE": "exit"}
    t0 = time.monotonic()
    proc = run_eval(f"model={tiny_model}", "size=4", "max_new_tokens=8", "reward.workers=1",
                    "workers=2",
                    f"out_dir={tmp_path}", env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "shard 1 of 2 (CPU" in proc.stderr and "failed: exit code 17" in proc.stderr
    assert (str(tmp_path / "shards" / "shard-1.log") in proc.stderr
            and "Traceback" not in proc.stderr)
    assert not (tmp_path / "eval.json").exists() and time.monotonic() - t0 < 60


@pytest.mark.slow  # ~25 s on 2 cores: `make test-slow`, which CI runs too
def test_a_stuck_worker_is_named_after_timeout_s(tiny_model, tmp_path):
    """Shard 1 freezes at start (fault injection, hang): the parent waited forever; now it stops
    the run after timeout_s, naming the shard, with the stuck worker's stacks in its log."""
    env = {**ENV, "AREAL_FAULT": "eval@1"}
    t0 = time.monotonic()
    proc = run_eval(f"model={tiny_model}", "size=4", "max_new_tokens=8", "reward.workers=1",
                    "workers=2",
                    "timeout_s=20", f"out_dir={tmp_path}", env=env, timeout=150)
    assert proc.returncode == 1, proc.stderr
    assert "shard 1 of 2 (CPU" in proc.stderr and "still running after timeout_s=20s" in proc.stderr
    assert "Traceback" not in proc.stderr and time.monotonic() - t0 < 100
    assert "faults.py" in (tmp_path / "shards" / "shard-1.log").read_text()  # where it was stuck


def test_waiting_for_scores_that_never_come_is_an_error():
    from concurrent.futures import Future

    from areal_cli.eval.runner import EvalStalled, wait_scores

    done = Future()
    done.set_result(1)
    t0 = time.monotonic()
    with pytest.raises(EvalStalled, match="no completion was scored for 0.5s"):
        wait_scores([done, Future()], 0.5)
    assert time.monotonic() - t0 < 5


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_engine_vllm_without_vllm_names_the_extra():
    proc = run_eval("engine=vllm", "gpus=[0,1]")
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'areal-cli[vllm]'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_gpus_that_are_not_visible_are_a_user_error():
    proc = run_eval("gpus=[0,1]")
    assert proc.returncode == 2, proc.stderr
    assert "no GPU is visible" in proc.stderr and "workers=N" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["gpus=[0,0]"], "distinct GPU ids"),
    (["workers=-1"], "workers=-1"),
    (["engine=vllm", "engine.vllm.tensor_parallel_size=2", "gpus=[0,1,2]"], "multiple of 2 GPUs"),
])
def test_bad_data_parallel_settings(args, message):
    from areal_cli.eval.config import compose_eval
    from areal_cli.runconfig.compose import ConfigError

    with pytest.raises(ConfigError, match=message):
        compose_eval(args)


def test_worker_gpus_follow_tensor_parallel_size():
    from areal_cli.eval.config import compose_eval

    cfg = compose_eval(["engine=vllm", "engine.vllm.tensor_parallel_size=2", "gpus=[0,1,2,3]"])[0]
    assert cfg.worker_count() == 2 and [cfg.worker_gpus(k) for k in (0, 1)] == [[0, 1], [2, 3]]
    cfg = compose_eval(["gpus=[4,5]", "workers=3"])[0]
    assert [cfg.worker_gpus(k) for k in range(3)] == [[4], [5], [4]]
    assert (not compose_eval([])[0].data_parallel()
            and compose_eval(["workers=2"])[0].data_parallel())


@pytest.mark.parametrize("n_items, n", [(0, 2), (1, 3), (5, 2), (7, 3), (64, 8)])
def test_shards_cover_every_item_once_in_order(n_items, n):
    items = list(range(n_items))
    assert sum((shard(items, k, n) for k in range(n)), []) == items
    sizes = [shard_bounds(n_items, k, n)[1] - shard_bounds(n_items, k, n)[0] for k in range(n)]
    assert max(sizes) - min(sizes) <= 1


def test_merge_orders_passes_then_problems():
    def sample(i, p, j=0):
        return {"prompt_id": f"t/eval/{i}", "pass": p, "sample": j, "score": float(i % 2),
                "length": 3, "finish_reason": "stop"}

    cfg = SimpleNamespace(task=SimpleNamespace(name="t"), n_samples=2)
    problems = [[SimpleNamespace(id=f"t/eval/{i}") for i in range(3)]]
    shards = [{"results": [{"model": "m", "task": "t", "wall_s": w, "samples": s}]} for w, s in (
        (1.0, [sample(0, "greedy"), sample(0, "sample"), sample(0, "sample", 1)]),
        (2.0,
         [sample(i, p, j) for i in (1, 2) for p,
          j in (("greedy", 0), ("sample", 0), ("sample", 1))]))]
    (r,) = merge([cfg], [("m", "/m")], problems, shards)
    assert [(s["pass"], s["prompt_id"][-1], s["sample"]) for s in r["samples"]] == [
        ("greedy", "0", 0), ("greedy", "1", 0), ("greedy", "2", 0),
        ("sample", "0", 0), ("sample", "0", 1), ("sample", "1", 0), ("sample", "1", 1),
        ("sample", "2", 0),
        ("sample", "2", 1)]
    assert r["metrics"]["accuracy"] == pytest.approx(1 / 3) and r["wall_s"] == 2.0
    assert r["model_path"] == "/m" and r["metrics"]["problems"] == 3


def test_gpu_ids_map_through_the_callers_visible_devices(monkeypatch):
    from areal_cli.runtime import physical_gpus

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert physical_gpus([0, 1]) == "0,1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert physical_gpus([1]) == "5" and physical_gpus([0, 2]) == "4,6"

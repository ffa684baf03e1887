"""RewardPool with real worker processes: hangs, errors, dead workers, custom import paths."""

import logging
import time
import uuid

import pytest

from areal_cli.config.task import RewardConfig
from areal_cli.rewards import RewardPool, score
from areal_cli.tasks import Problem

CUSTOM = """
import os, time

def hang_on_every_fifth(completion, problem):
    if int(problem.id) % 5 == 0:
        time.sleep(10_000)  # hangs "forever"
    return float(completion == problem.answer)

def raise_or_die(completion, problem):
    if completion == "raise":
        raise RuntimeError("scorer bug")
    if completion == "die":
        os._exit(3)
    return 1.0

def slow_or_nonfinite(completion, problem):
    if completion == "slow":
        time.sleep(0.5)
    return {"nan": float("nan"), "inf": float("-inf")}.get(completion, 1.0)
"""


@pytest.fixture
def module(tmp_path, monkeypatch):
    name = f"areal_test_reward_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(CUSTOM)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers inherit sys.path
    return name


def problems(n):
    return [Problem(str(i), f"q{i}", f"a{i}", {}) for i in range(n)]


def test_hanging_calls_time_out_without_blocking_others(module, caplog):
    timeout = 1.5
    cfg = RewardConfig(fn=f"{module}:hang_on_every_fifth", timeout_s=timeout)
    caplog.set_level(logging.WARNING, logger="areal_cli.rewards.pool")
    with RewardPool(cfg, num_workers=5) as pool:
        pool.submit("warm", Problem("1", "", "", {})).result(timeout=30)  # workers are up
        start = time.monotonic()
        items = problems(20)  # ids 0, 5, 10, 15 hang: 20%
        futures = [pool.submit(p.answer if i % 2 else "wrong", p) for i, p in enumerate(items)]
        done_at = {}
        for p, f in zip(items, futures, strict=True):
            f.add_done_callback(lambda _, i=p.id: done_at.setdefault(i, time.monotonic() - start))
        for p, f in zip(items, futures, strict=True):
            result = f.result(timeout=timeout * 3 + 10)
            if int(p.id) % 5 == 0:
                assert (result.score, result.status) == (0.0, "timeout"), p.id
            else:
                assert result.status == "ok" and result.score == float(int(p.id) % 2), p.id
        # 4 hangs on 5 workers: the others never wait for a timeout, and all are back
        # within timeout + slack (worker replacement included)
        assert max(done_at.values()) < timeout + 3.0
        assert max(t for i, t in done_at.items() if int(i) % 5) < timeout
        assert pool.timeouts == 4 and pool.errors == 0
    logged = [r.getMessage() for r in caplog.records]
    assert sorted(m.split("problem ")[1].split(":")[0] for m in logged) == ["0", "10", "15", "5"]


def test_exceptions_and_dead_workers_score_zero(module):
    with RewardPool(RewardConfig(fn=f"{module}:raise_or_die", timeout_s=20), 2) as pool:
        results = [pool.submit(c, Problem("p", "", "", {})).result(timeout=60)
                   for c in ("raise", "die", "fine")]  # fmt: skip
        assert [(r.score, r.status) for r in results] == [
            (0.0, "error"),
            (0.0, "error"),
            (1.0, "ok"),
        ]
        assert "RuntimeError: scorer bug" in results[0].detail
        assert "exit code 3" in results[1].detail
        assert pool.errors == 2 and pool.timeouts == 0
    with pytest.raises(RuntimeError, match="after close"):
        pool.submit("x", Problem("p", "", "", {}))


def test_bad_custom_import_paths_name_the_fix(module):
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_mod_xyz'.*PYTHONPATH"):
        RewardPool(RewardConfig(fn="no_such_mod_xyz:f"))
    with pytest.raises(ValueError,
                       match=rf"module '{module}' has no function 'nope'.*define nope\(completion"):
        score("x", Problem("p", "", "", {}), RewardConfig(fn=f"{module}:nope"))
    with pytest.raises(ValueError, match="'my_module:my_fn'"):
        score("x", Problem("p", "", "", {}), RewardConfig(fn="magic"))


def test_the_pool_thread_survives_a_cancelled_call(module):
    """The caller cancels a call while a worker scores it: setting its result raised in the pool's
    thread, which died, and every later call then never resolved."""
    cfg = RewardConfig(fn=f"{module}:slow_or_nonfinite", timeout_s=5)
    with RewardPool(cfg, num_workers=1) as pool:
        pool.submit("warm", Problem("w", "", "", {})).result(timeout=30)
        first = pool.submit("slow", Problem("0", "", "", {}))
        assert first.cancel()
        later = [pool.submit("ok", p) for p in problems(3)]
        assert [f.result(timeout=20).status for f in later] == ["ok"] * 3
        assert pool._thread.is_alive()


def test_non_finite_scores_are_zero_and_counted(module):
    cfg = RewardConfig(fn=f"{module}:slow_or_nonfinite", timeout_s=5)
    with RewardPool(cfg, num_workers=1) as pool:
        results = [pool.submit(c, p).result(timeout=30) for c,
                   p in zip(["nan", "inf", "ok"], problems(3),
                                                                          strict=True)]
        assert [(r.score, r.status) for r in results] == [(0.0, "nonfinite"), (0.0, "nonfinite"),
                                                          (1.0, "ok")]
        assert pool.nonfinite == 2 and pool.errors == 0

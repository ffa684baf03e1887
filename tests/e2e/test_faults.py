"""Nothing hangs: a stopped rollout worker, a trainer rank stalled in a collective and reward
calls that never return each end in a named error (or a scored timeout) in bounded time, with
no process left; hostile input is refused before anything starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time

import pytest
from conftest import AREAL, ROOT, TINY_RUN, read_jsonl, run_train


def _left(run_dir) -> list[str]:
    return subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True,
                          text=True).stdout.split()


def _wait_metrics(run_dir, proc, timeout=180):
    deadline = time.monotonic() + timeout
    while not (run_dir / "metrics.jsonl").exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no step finished"
        time.sleep(0.3)


@pytest.mark.slow
def test_stopped_rollout_worker_is_named_with_its_stack(tiny_model, tmp_path):
    cmd = AREAL + ["train", "--quiet", f"run_dir={tmp_path}", f"model={tiny_model}", *TINY_RUN,
                   "trainer.steps=50", "launcher.peer_timeout_s=6"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    _wait_metrics(tmp_path, proc)
    pid = json.loads((tmp_path / "pids.json").read_text())["rollout-0"]
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 40
    assert "rollout-0" in err and "heartbeat" in err
    time.sleep(0.5)
    assert not _left(tmp_path)
    assert "File " in (tmp_path / "logs" / "rollout-0.log").read_text(), "no stack dump"


@pytest.mark.slow
def test_trainer_rank_stalled_in_a_collective_is_an_error(tiny_model, tmp_path):
    env = {**os.environ, "AREAL_FAULT": "train@1", "AREAL_FAULT_RANK": "1"}
    cmd = AREAL + ["train", "--quiet", f"run_dir={tmp_path}", f"model={tiny_model}", *TINY_RUN,
                   "trainer.steps=5", "trainer.ranks=2", "launcher.peer_timeout_s=10"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode != 0
    assert "trainer" in proc.stderr
    assert (tmp_path / "FAULT_REACHED").exists()
    assert time.monotonic() - t0 < 200
    time.sleep(0.5)
    assert not _left(tmp_path)


@pytest.mark.slow
def test_reward_calls_that_never_return_are_scored_timeouts(tiny_model, tmp_path):
    mod = tmp_path / "hang_reward.py"
    mod.write_text(textwrap.dedent("""
        import time, zlib
        def fn(completion, problem):
            if zlib.crc32(problem.id.encode()) % 5 == 0:  # 20% of the prompts
                time.sleep(10**6)
            return 1.0 if "1" in completion else 0.0
    """))
    env_path = f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"
    os.environ["PYTHONPATH"] = env_path
    try:
        run_train(tmp_path / "r", f"model={tiny_model}", *TINY_RUN, "trainer.steps=4",
                  "reward.fn=hang_reward:fn", "reward.timeout_s=1.0", "reward.workers=2",
                  "reward.max_error_fraction=1")  # a batch of 2 groups may be all timeouts: go on
    finally:
        os.environ["PYTHONPATH"] = env_path.split(":", 1)[1]
    metrics = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert len(metrics) == 4
    assert sum(m["reward_timeouts"] for m in metrics) > 0
    traj = read_jsonl(tmp_path / "r" / "trajectories.jsonl")
    assert all(t["reward"] == 0.0 for t in traj if t["reward_status"] == "timeout")


@pytest.mark.parametrize("overrides,needle", [
    (["task=jsonl", "task.path={empty}"], "empty"),
    (["task=jsonl", "task.path={bad}"], "line 2"),
    (["task=jsonl", "task.path={long}"], "token prompt"),
    (["rollout.max_new_tokens=0"], "rollout.max_new_tokens"),
    (["trainer.ranks=3"], "trainer.ranks=3"),
    (["cluster.gpus=[7]"], "GPU id"),
    (["launcher.port_base={port}"], "in use"),
])
def test_hostile_input_gets_a_clear_message(tmp_path, overrides, needle):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": 3,\n')
    # one held out, one trains
    long = [{"prompt": "word " * 9000 + end, "answer": "1"} for end in "ab"]
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in long))
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    fmt = {"empty": tmp_path / "empty.jsonl", "bad": tmp_path / "bad.jsonl",
           "long": tmp_path / "long.jsonl", "port": busy.getsockname()[1]}
    args = [o.format(**fmt) for o in overrides]
    proc = subprocess.run(AREAL + ["train", f"run_dir={tmp_path}/r", "task.eval_size=0", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    busy.close()
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r" / "logs").exists()


@pytest.mark.slow
def test_a_nan_gradient_skips_its_step_keeps_its_batch_and_the_run_goes_on(tiny_model, tmp_path,
                                                                           monkeypatch):
    """A real run whose step 1 gets a NaN gradient (as an overflow leaves one): that step leaves the
    weights alone and is counted, its batch is kept for a replay and named, and the run finishes."""
    from areal_cli.transport.messages import decode

    monkeypatch.setenv("AREAL_FAULT", "grad@1")
    proc = run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, "trainer.steps=4")
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["skipped_steps"] for r in rows] == [0, 1, 1, 1]
    # NaN at step 1 only
    assert [r["grad_norm"] != r["grad_norm"] for r in rows] == [False, True, False, False]
    kept = tmp_path / "nonfinite" / "batch_1.msgpack"
    assert sorted(p.name for p in (tmp_path / "nonfinite").iterdir()) == [kept.name]
    assert decode(kept.read_bytes()).groups  # the wire frame of the step's batch
    assert str(kept) in proc.stderr + (tmp_path / "logs" / "trainer-0.log").read_text()
    assert (tmp_path / "checkpoints" / "final").is_dir()


@pytest.mark.slow
def test_nan_gradients_in_a_row_stop_the_run_naming_the_parameters(tiny_model, tmp_path,
                                                                   monkeypatch):
    """trainer.max_nonfinite_steps such steps in a row end the run with an error that names the
    parameters and the fix, with no process left; the batches of the first two are kept."""
    monkeypatch.setenv("AREAL_FAULT", "grad@1,2")
    proc = run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, "trainer.steps=6",
                     "trainer.max_nonfinite_steps=2",
                     check=False)
    assert proc.returncode != 0
    said = proc.stderr + (tmp_path / "logs" / "trainer-0.log").read_text()
    assert "steps 1-2: the gradient norm was not finite in 2 steps in a row" in said
    assert "model.embed_tokens.weight" in said and "trainer.detect_anomaly=true" in said
    assert sorted(p.name for p in (tmp_path / "nonfinite").iterdir()) == ["batch_1.msgpack",
                                                                          "batch_2.msgpack"]
    # nothing trained after the stop
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")][-1] <= 2
    time.sleep(0.5)
    assert not _left(tmp_path)

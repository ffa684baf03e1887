"""Real runs against the hangs and bad values of the run directory: a process stuck in its main
loop is named although its heartbeat thread lives on; a NaN reward never reaches the model; a
resumed run stopped before its first new step keeps its checkpoint and resumes again."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import textwrap
import time

import msgpack
import pytest
from conftest import AREAL, ROOT, TINY_RUN, read_jsonl, run_train

pytestmark = pytest.mark.slow


def _left(run_dir) -> list[str]:
    return subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True,
                          text=True).stdout.split()


def _wait_for(path, proc, timeout=180):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.2)


@pytest.mark.parametrize("fault,stuck", [("train@1", "trainer-0"), ("generate@1", "rollout-0")])
def test_a_process_stuck_in_its_main_loop_is_named(tiny_model, tmp_path, fault, stuck):
    """The fault freezes the main thread; its heartbeat thread keeps beating (the old liveness check
    saw a healthy process forever). The controller sees work held and no progress."""
    cmd = AREAL + ["train", "--quiet", f"run_dir={tmp_path}", f"model={tiny_model}", *TINY_RUN,
                   "trainer.steps=4", "launcher.progress_timeout_s=8"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            env={**os.environ, "AREAL_FAULT": fault})
    _wait_for(tmp_path / "FAULT_REACHED", proc)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert f"{stuck} made no progress" in err and "launcher.progress_timeout_s=8" in err, err
    assert time.monotonic() - t0 < 60
    time.sleep(0.5)
    assert not _left(tmp_path)


def test_a_nan_reward_is_scored_zero_counted_and_never_trained(tiny_model, tmp_path):
    mod = tmp_path / "nan_reward.py"
    mod.write_text(textwrap.dedent("""
        import zlib
        def fn(completion, problem):
            if zlib.crc32(problem.id.encode()) % 2:  # half of the prompts
                return float("nan")
            return 1.0 if "1" in completion else 0.0
    """))
    env_path = f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"
    os.environ["PYTHONPATH"] = env_path
    try:
        run_train(tmp_path / "r", f"model={tiny_model}", *TINY_RUN, "trainer.steps=3",
                  "reward.fn=nan_reward:fn")
    finally:
        os.environ["PYTHONPATH"] = env_path.split(":", 1)[1]
    metrics = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert sum(m["reward_nonfinite"] for m in metrics) > 0
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["reward_mean"]) for m in metrics)
    traj = read_jsonl(tmp_path / "r" / "trajectories.jsonl")
    assert {t["reward"] for t in traj if t["reward_status"] == "nonfinite"} == {0.0}
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "r" / "checkpoints" / "final" / "model.safetensors")
    assert all(bool(t.isfinite().all()) for t in weights.values())


def test_resume_then_sigterm_before_the_first_new_step_then_resume_again(tiny_model, tmp_path):
    """Resumed from step_1, stopped while waiting for its first new batch: the trainer writes step_1
    again and the controller renamed it onto the existing step_1 (a crash). The resumed launcher
    also shows progress (no --quiet): its reader must survive resume truncating metrics.jsonl."""
    base = [f"model={tiny_model}", *TINY_RUN, "checkpoint.every=1", "rollout.max_staleness=1",
            "rollout.batch_order=admission", "rollout.max_concurrent=4"]
    run_train(tmp_path, *base, "trainer.steps=2")
    assert (tmp_path / "checkpoints" / "step_1" / "controller.json").is_file()
    # as if every group was still generating at the checkpoint: resume regenerates them all, and the
    # frozen worker below never finishes one, so no batch comes
    (tmp_path / "checkpoints" / "step_1" / "buffer.msgpack").write_bytes(msgpack.packb([]))
    (tmp_path / "FAULT_REACHED").unlink(missing_ok=True)
    proc = subprocess.Popen(AREAL + ["train", f"resume={tmp_path}", "trainer.steps=2",
                                     "launcher.stop_timeout_s=20"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # no new batch will come
                            env={**os.environ, "AREAL_FAULT": "generate@1"})
    # the worker has the resumed weights: the trainer waits
    _wait_for(tmp_path / "FAULT_REACHED", proc)
    log = tmp_path / "logs" / "trainer-0.log"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    controller = (tmp_path / "logs" / "controller.log").read_text()
    assert "Traceback" not in controller and "already complete" in controller, controller[-3000:]
    assert "Traceback" not in err and "resumed from" in log.read_text()
    assert (tmp_path / "checkpoints" / "step_1" / "controller.json").is_file()
    assert not list((tmp_path / "checkpoints").glob("step_1.partial"))
    time.sleep(0.5)
    assert not _left(tmp_path)
    proc = subprocess.run(AREAL + ["train", f"resume={tmp_path}", "trainer.steps=3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert "step 3/3" in proc.stdout  # the live progress shows the resumed steps (step 3 is new)


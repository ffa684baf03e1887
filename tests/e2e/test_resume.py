"""Nothing lost: kill a run hard at three points, resume it, and compare with an uninterrupted
run; SIGTERM leaves a complete checkpoint; a half-written checkpoint is never used."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from conftest import AREAL, ROOT, TINY_RUN, read_jsonl, run_train

STEPS = 5
RESUMABLE = [*TINY_RUN, f"trainer.steps={STEPS}", "rollout.max_staleness=1", "checkpoint.every=1",
             "rollout.batch_order=admission", "rollout.max_concurrent=4"]

pytestmark = pytest.mark.slow


def _kill_everything(run_dir, launcher: subprocess.Popen) -> None:
    pids = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True,
                          text=True).stdout.split()
    for pid in [launcher.pid, *map(int, pids)]:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait(timeout=10)
    time.sleep(0.5)


def _start(run_dir, model, *extra, env=None):
    cmd = AREAL + ["train", "--quiet", f"run_dir={run_dir}", f"model={model}", *RESUMABLE, *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            env={**os.environ, **(env or {})})


def _wait_for(path, timeout=180):
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert path.exists(), f"{path.name} never appeared"


@pytest.fixture(scope="module")
def uninterrupted(tiny_model, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("whole")
    run_train(run_dir, f"model={tiny_model}", *RESUMABLE)
    return read_jsonl(run_dir / "trajectories.jsonl")


@pytest.mark.parametrize("fault", ["generate@2", "train@3", "weights@2"])
def test_kill_and_resume_trains_each_sample_once(tiny_model, tmp_path, uninterrupted, fault):
    proc = _start(tmp_path, tiny_model, env={"AREAL_FAULT": fault})
    _wait_for(tmp_path / "FAULT_REACHED")
    _kill_everything(tmp_path, proc)
    done_before = len(read_jsonl(tmp_path / "metrics.jsonl"))
    assert done_before < STEPS
    run_train(tmp_path, f"resume={tmp_path}")
    traj = read_jsonl(tmp_path / "trajectories.jsonl")
    keys = [(t["prompt_id"], t["sample_index"]) for t in traj]
    assert len(keys) == len(set(keys)), "a sample was trained twice"
    assert {t["prompt_id"] for t in traj} == {t["prompt_id"] for t in uninterrupted}
    assert all(t["trained_version"] - t["version_start"] <= 1 for t in traj)
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(STEPS))


def test_sigterm_leaves_a_complete_checkpoint_and_partial_ones_are_ignored(tiny_model, tmp_path):
    # the trainer pauses inside step 2, so the signal lands mid-run however fast the steps are
    proc = _start(tmp_path, tiny_model, "checkpoint.every=0", "launcher.stop_timeout_s=60",
                  env={"AREAL_FAULT": "train@2", "AREAL_FAULT_MODE": "pause",
                       "AREAL_FAULT_PAUSE_S": "5"})
    _wait_for(tmp_path / "FAULT_REACHED")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=90)
    ckpts = [d.name for d in (tmp_path / "checkpoints").iterdir()]
    complete = [c for c in ckpts if c.startswith("step_") and not c.endswith(".partial")]
    assert complete, f"no complete checkpoint after SIGTERM: {ckpts}"
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True,
                          text=True).stdout.split()
    assert not left
    # a half-written checkpoint (killed during the write) must never be picked
    (tmp_path / "checkpoints" / "step_99.partial" / "trainer").mkdir(parents=True)
    from areal_cli.controller.state import latest_checkpoint

    assert latest_checkpoint(tmp_path).name == max(complete, key=lambda c: int(c.split("_")[1]))
    run_train(tmp_path, f"resume={tmp_path}")
    traj = read_jsonl(tmp_path / "trajectories.jsonl")
    keys = [(t["prompt_id"], t["sample_index"]) for t in traj]
    assert len(keys) == len(set(keys)) == STEPS * 4


def test_resume_refuses_overrides_that_change_training(tiny_model, tmp_path):
    (tmp_path / "config.yaml").write_text("")
    run_train(tmp_path / "r", f"model={tiny_model}", *TINY_RUN, "trainer.steps=1")
    proc = subprocess.run(AREAL + ["train", f"resume={tmp_path / 'r'}", "trainer.lr=1.0"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "trainer.lr" in proc.stderr

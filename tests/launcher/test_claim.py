"""The run directory: unique names, one live run at a time, no links followed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import AREAL, ROOT

from areal_cli.launcher.claim import RunDirError, RunLock, check_links, new_run_dir
from areal_cli.launcher.plan import make_plan
from areal_cli.runconfig.compose import compose, save_yaml


@pytest.mark.slow  # 10-19 s: make test-slow (make test stays within 15 minutes)
def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path):
    dirs = [new_run_dir(tmp_path) for _ in range(50)]
    assert len(set(dirs)) == 50 and all(d.is_dir() for d in dirs)
    names = {make_plan(compose(["trainer.steps=1"]), gpus=[]).run_dir.name for _ in range(20)}
    assert len(names) == 20  # --dry-run's names differ too


def test_a_second_lock_names_the_holder_and_a_released_lock_is_free(tmp_path):
    held = RunLock(tmp_path)
    code = ("import sys; from areal_cli.launcher.claim import RunLock, RunDirError\n"
            "try:\n    RunLock(sys.argv[1])\nexcept RunDirError as e:\n    print(e); sys.exit(2)\n")
    other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                           text=True,
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert other.returncode == 2 and f"pid {os.getpid()}" in other.stdout
    held.release()
    RunLock(tmp_path).release()


def test_the_lock_goes_with_the_process_that_held_it(tmp_path):
    code = ("import sys, os; from areal_cli.launcher.claim import RunLock; RunLock(sys.argv[1]); "
            "os._exit(9)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    RunLock(tmp_path).release()  # a crashed holder leaves no stale lock


@pytest.mark.slow  # 10-19 s: make test-slow (make test stays within 15 minutes)
def test_resume_of_a_locked_run_dir_exits_2_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)  # as areal makes them: a run others can read is refused before its lock
    save_yaml(compose(["trainer.steps=1", "task.size=8", f"run_dir={run}"]), run / "config.yaml")
    lock = RunLock(run)
    proc = subprocess.run(AREAL + ["train", "--quiet", f"resume={run}"], capture_output=True,
                          text=True,
                          cwd=ROOT, timeout=180)
    lock.release()
    assert proc.returncode == 2, proc.stderr
    assert f"in use by another areal run (pid {os.getpid()})" in proc.stderr
    assert "Traceback" not in proc.stderr and not (run / "logs").exists()


def test_links_in_a_run_directory_are_named(tmp_path):
    outside = tmp_path / "elsewhere"
    (outside / "step_3").mkdir(parents=True)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_3").symlink_to(outside / "step_3")
    (run / "metrics.jsonl").symlink_to(outside / "m.jsonl")
    problems = check_links(run)
    assert len(problems) == 2 and all("symbolic link" in p for p in problems)
    assert any("checkpoints/step_3" in p for p in problems) and any("metrics.jsonl" in p
                                                                    for p in problems)
    with pytest.raises(RunDirError):
        (run / "run.lock").symlink_to(outside / "lock")
        RunLock(run)


@pytest.mark.slow  # 10-19 s: make test-slow (make test stays within 15 minutes)
def test_a_dry_run_checks_what_a_start_checks(tmp_path):
    """--dry-run prints the plan, then runs the start's checks (the model, the data, custom code):
    a data file a start would refuse exits 2 here too, naming it."""
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n{"question": ')
    proc = subprocess.run(AREAL + ["train", "--dry-run", "task=jsonl", f"task.path={data}",
                                   "task.prompt_field=question", "task.answer_field=answer"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(data) in proc.stderr and "# commands" in proc.stdout  # the plan, then the problem
    ok = subprocess.run(AREAL + ["train", "--dry-run"], capture_output=True, text=True,
                        cwd=tmp_path, timeout=120)
    assert ok.returncode == 0 and "# preflight:" in ok.stdout, ok.stderr
    assert not list(tmp_path.glob("runs"))  # a dry run creates nothing
    plan = subprocess.run(AREAL + ["train", "--dry-run", "--no-checks", "task=jsonl",
                                   f"task.path={data}", "task.prompt_field=question",
                                   "task.answer_field=answer"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert plan.returncode == 0 and "# preflight:" not in plan.stdout  # the plan alone

"""What keeps the CPU run's memory low, checked on a real run: `areal train` becomes the lean
watcher once the run is planned (same pid, no torch mapped), the controller maps no torch, one
CPU trainer rank runs without a torchrun agent, and the trainer and rollout worker get the
allocator the plan names."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from conftest import AREAL, ROOT, TINY_RUN

from areal_cli.launcher.plan import find_allocator


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def _environ(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = [e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e]
    return {k.decode(): v.decode(errors="replace") for k, v in items}


@pytest.mark.slow  # a whole run's start (~20 s on 2 cores): `make test-slow`, which CI runs too
def test_the_launcher_and_controller_hold_no_torch_and_one_cpu_rank_has_no_agent(tiny_model,
                                                                                 tmp_path):
    cmd = AREAL + ["train", "--quiet", f"run_dir={tmp_path}", f"model={tiny_model}", *TINY_RUN,
                   "trainer.steps=40",
                   "eval.at_end=false"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "metrics.jsonl").exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no step within 240 s"
            time.sleep(0.2)
        pids = json.loads((tmp_path / "pids.json").read_text())
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert b"areal_cli.launcher.watch" in f.read()  # the same pid, exec'ed
        assert "libtorch" not in _maps(proc.pid)
        assert "libtorch" not in _maps(pids["controller"])
        with open(f"/proc/{pids['trainer']}/cmdline", "rb") as f:
            trainer_cmd = f.read()
        assert b"areal_cli.trainer.main" in trainer_cmd and b"torchrun" not in trainer_cmd
        found = find_allocator("auto")
        for name in ("trainer", f"rollout-{0}"):
            preload = _environ(pids[name]).get("LD_PRELOAD", "")
            assert (found[1] in preload) if found else found is None, (name, preload)
            if found:
                assert found[1].split(".so")[0] in _maps(pids[name])
    finally:
        proc.terminate()
        proc.communicate(timeout=120)
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True,
                          text=True).stdout.split()
    assert not left, f"processes left: {left}"
    assert os.path.exists(tmp_path / "config.yaml")

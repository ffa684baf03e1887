"""``areal train`` for real: controller, rollout worker(s), torchrun trainer ranks, ZeroMQ on
loopback, gloo weight broadcast, a real (tiny) model; the contract read from the run dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import torch
from conftest import AREAL, ROOT, TINY_RUN, read_jsonl, run_train

CONTRACT_METRICS = {"step", "version", "reward_mean", "trained_tokens", "step_time_s",
                    "staleness_max",
                    "staleness_mean", "weight_sync_s", "gen_tokens_per_s", "train_tokens_per_s",
                    "wall_time_s"}
CONTRACT_TRAJ = {"prompt_id", "sample_index", "version_start", "version_end", "trained_version",
                 "reward", "num_tokens", "finish_reason"}


def test_async_run_keeps_staleness_bound(tiny_model, tmp_path):
    eta, steps = 1, 5
    run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, f"trainer.steps={steps}",
              f"rollout.max_staleness={eta}", "rollout.max_concurrent=4")
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(steps))
    assert CONTRACT_METRICS <= set(metrics[0])
    traj = read_jsonl(tmp_path / "trajectories.jsonl")
    assert len(traj) == steps * 2 * 2
    assert CONTRACT_TRAJ <= set(traj[0])
    assert all(t["trained_version"] - t["version_start"] <= eta for t in traj)
    assert max(t["trained_version"] - t["version_start"] for t in traj) >= 1, "never ran ahead"
    assert len({(t["prompt_id"], t["sample_index"]) for t in traj}) == len(traj)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "final")


@pytest.mark.slow  # a whole run (30-60 s on 2 cores): `make test-slow`, which CI runs too
def test_synchronous_mode_is_on_policy(tiny_model, tmp_path):
    proc = run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, "trainer.steps=3",
                     "rollout.max_staleness=0",
              "eval.every=2", "eval.at_end=true", "eval.size=4")
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [("eval/basic_arithmetic/accuracy" in m) for m in metrics] == [False, True, False]
    final = json.loads((tmp_path / "eval_final.json").read_text())
    assert final["problems"] == 4 and 0 <= final["trained"]["accuracy"] <= 1
    assert "held-out greedy accuracy" in proc.stdout
    traj = read_jsonl(tmp_path / "trajectories.jsonl")
    assert len(traj) == 12
    assert all(t["version_start"] == t["version_end"] == t["trained_version"] for t in traj)


@pytest.mark.slow  # a whole run (30-60 s on 2 cores): `make test-slow`, which CI runs too
def test_weight_broadcast_bit_exact_two_trainer_ranks(tiny_model, tmp_path):
    run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, "trainer.steps=2", "trainer.ranks=2",
              "rollout.workers=2", "weights.verify=true", "weights.bucket_mb=1")
    sent = {m["version"]: m["weights_sha"] for m in read_jsonl(tmp_path / "metrics.jsonl")}
    loaded = read_jsonl(tmp_path / "weight_updates.jsonl")
    assert {u["worker"] for u in loaded} == {"rollout-0", "rollout-1"}
    assert len(loaded) == 4
    for u in loaded:
        assert u["weights_sha"] == sent[u["version"]], f"{u['worker']} v{u['version']} differs"
    # the final checkpoint, gathered a layer at a time from both ranks' shards: where no step had a
    # gradient (the tiny model's rewards are all 0), exactly the weights it started from
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "final").state_dict()
    start = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    assert set(final) == set(start)
    same = all(torch.equal(final[k], start[k].to(final[k].dtype)) for k in start)
    moved = any(m["grad_norm"] > 0 for m in read_jsonl(tmp_path / "metrics.jsonl"))
    assert same != moved


def _start_until_first_step(cmd, run_dir):
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 180
    while not (run_dir / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert (run_dir / "metrics.jsonl").exists(), "no step finished"
    return proc


@pytest.mark.slow  # a whole run (30-60 s on 2 cores): `make test-slow`, which CI runs too
def test_killed_rollout_worker_stops_the_run(tiny_model, tmp_path):
    cmd = AREAL + ["train", "--quiet", f"run_dir={tmp_path}", f"model={tiny_model}", *TINY_RUN,
                   "trainer.steps=50"]
    proc = _start_until_first_step(cmd, tmp_path)
    pids = json.loads((tmp_path / "pids.json").read_text())
    os.kill(pids["rollout-0"], signal.SIGKILL)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30
    assert proc.returncode != 0
    assert "rollout-0" in err
    assert "SIGKILL" in err and "out-of-memory" in err  # what usually sends it, and where to look
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True,
                          text=True).stdout.split()
    assert not left, f"processes of the run left behind: {left}"


@pytest.mark.parametrize("override,needle", [
    ("trainer.stepz=3", "trainer.stepz"),
    ("trainer.steps=abc", "trainer.steps"),
    ("rollout.max_staleness=-1", "rollout.max_staleness"),
    ("engine=nope", "engine/nope"),
    ("model=/no/such/model", "/no/such/model"),
])
def test_bad_input_is_a_clear_error(tmp_path, override, needle):
    proc = subprocess.run(AREAL + ["train", f"run_dir={tmp_path}/r", override], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r" / "logs").exists(), "processes were started"


def test_dry_run_prints_config_devices_commands(tmp_path):
    proc = subprocess.run(AREAL + ["train", "--dry-run", "--no-checks", f"run_dir={tmp_path}/r",
                                   "trainer.ranks=2",
                                   "trainer.batch_size=4"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for needle in ("# resolved config", "max_staleness: 4", "# device map", "rollout: CPU",
                   "areal_cli.controller.main", "--nproc-per-node 2", "areal_cli.rollout.main"):
        assert needle in proc.stdout
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
@pytest.mark.parametrize("workflow", ["multi_turn", "tool_use"])
def test_multi_turn_workflows_train(tiny_model, tmp_path, workflow):
    run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, "trainer.steps=2", f"workflow={workflow}")
    traj = read_jsonl(tmp_path / "trajectories.jsonl")
    assert len(traj) == 8 and all(1 <= t["num_turns"] <= 2 for t in traj)
    if workflow == "multi_turn":
        assert any(t["num_turns"] == 2 for t in traj)


@pytest.mark.slow  # a whole run (~25 s on 2 cores): `make test-slow`, which CI runs too
def test_ctrl_c_stops_everything_within_10_seconds(tiny_model, tmp_path):
    cmd = AREAL + ["train", "--quiet", f"run_dir={tmp_path}", f"model={tiny_model}", *TINY_RUN,
                   "trainer.steps=50"]
    proc = _start_until_first_step(cmd, tmp_path)
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 10
    assert proc.returncode != 0
    time.sleep(0.3)
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True,
                          text=True).stdout.split()
    assert not left, f"processes of the run left behind: {left}"


@pytest.mark.slow  # a whole run (30-60 s on 2 cores): `make test-slow`, which CI runs too
def test_alternate_share_sleeps_the_workers_through_every_step(tiny_model, tmp_path):
    """cluster.share=alternate: each batch goes to the trainer only once every worker sleeps, and
    they wake at the update after the step: each update's sleep outlasts the step it made room
    for, and no group generated while the trainer stepped."""
    steps = 3
    run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, f"trainer.steps={steps}",
              "rollout.workers=2", "cluster.share=alternate", "rollout.max_staleness=1")
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(steps))
    updates = read_jsonl(tmp_path / "weight_updates.jsonl")
    for m in metrics[:-1]:  # the last step's update may come after the workers' stop
        slept = [u["asleep_s"] for u in updates if u["version"] == m["version"]]
        assert len(slept) == 2, updates  # both workers, each once
        assert min(slept) >= m["step_time_s"], (slept, m)
    log = (tmp_path / "logs" / "rollout-0.log").read_text()
    assert all(f"asleep for batch {s}:" in log for s in range(steps)), log

"""`areal train` on one GPU: the trainer and the engine on the same card, weights through CUDA
IPC, every update applied and verified (engine=vllm: its probe's logprobs moved)."""

from __future__ import annotations

import importlib.util

import pytest
import yaml
from conftest import run_train

from areal_cli.bench.summary import read_jsonl
from areal_cli.rundir import RunDir

SHORT = ["cluster.gpus=[0]", "trainer.steps=4", "trainer.batch_size=8", "rollout.group_size=4",
         "rollout.max_new_tokens=64", "task.eval_size=16", "launcher.peer_timeout_s=300"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
def test_vllm_and_the_trainer_share_one_gpu(tmp_path):
    """No engine named: vLLM, since it is installed and the run is on a GPU."""
    run = tmp_path / "vllm"
    proc = run_train(run, *SHORT, "engine.gpu_memory_utilization=0.3", timeout=900)
    assert "engine=vllm (auto: GPU(s) [0] here and vLLM installed" in proc.stdout
    assert "rollout.max_staleness=1 (auto on one GPU shared by vLLM" in proc.stdout
    cfg = yaml.safe_load(RunDir(run).config.read_text())
    assert cfg["engine"]["name"] == "vllm"
    assert cfg["weights"]["backend"] == "ipc" and cfg["engine"]["weight_update"] == "inplace"
    updates = read_jsonl(RunDir(run).weight_updates)
    assert len(updates) >= 3
    assert all(u.get("weights_unchanged") == 0 for u in updates)  # every update changed them
    verified = [u for u in updates if "probe_logp_change" in u]
    assert verified and all(u["probe_logp_change"] > 0 for u in verified)
    assert all(u["pause_total_s"] < 1.0 for u in updates)  # the pause is the swap


def test_the_hf_engine_and_the_trainer_share_one_gpu(tmp_path):
    run = tmp_path / "hf"
    run_train(run, *SHORT, "engine=hf", timeout=900)
    cfg = yaml.safe_load(RunDir(run).config.read_text())
    assert cfg["weights"]["backend"] == "ipc"
    assert len(read_jsonl(RunDir(run).metrics)) == 4
    assert len(read_jsonl(RunDir(run).weight_updates)) >= 3


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
def test_vllm_sleeps_while_the_trainer_steps_with_cluster_share_alternate(tmp_path):
    """cluster.share=alternate: vLLM sleeps (KV cache freed, weights in host memory) for each
    step, wakes at the update, takes it in through CUDA IPC and is verified as in concurrent."""
    run = tmp_path / "alternate"
    proc = run_train(run, *SHORT, "engine=vllm", "cluster.share=alternate", timeout=900)
    assert "alternate: vllm sleeps while the trainer steps" in proc.stdout
    cfg = yaml.safe_load(RunDir(run).config.read_text())
    assert cfg["cluster"]["share"] == "alternate" and cfg["engine"]["vllm"]["staging"] is False
    updates = read_jsonl(RunDir(run).weight_updates)
    metrics = {m["version"]: m for m in read_jsonl(RunDir(run).metrics)}
    assert len(updates) >= 3
    for u in updates:  # each ended a sleep at least as long as the step it made room for
        assert u["asleep_s"] >= metrics[u["version"]]["step_time_s"]
    assert all(u.get("weights_unchanged") == 0 for u in updates)
    verified = [u for u in updates if "probe_logp_change" in u]
    assert verified and all(u["probe_logp_change"] > 0 for u in verified)
    log = (RunDir(run).logs / "rollout-0.log").read_text()
    assert "GiB freed in" in log  # vLLM's sleep gave memory back

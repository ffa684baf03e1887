"""A LoRA run of the tiny model for real (every process, gloo, ZeroMQ on loopback): each update
carries the adapter and is verified on the engine's side; logp_gap_fresh is reported; a checkpoint
holds the adapter and a resume continues it; the final checkpoint is a merged model that `areal eval
model=<run_dir>` evaluates and `areal train model=<run_dir>/checkpoints/final` continues from. (The
tiny model's rewards are all 0, so no row trains and logp_gap_fresh has no fresh token here: the
default-task run reports it.)"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import AREAL, ROOT, TINY_RUN, read_jsonl, run_train
from safetensors import safe_open

from areal_cli.lora import saved_rank
from areal_cli.rundir import RunDir

LORA = ("trainer.lora.rank=4", "trainer.lora.alpha=8", "trainer.lr=1e-3", "checkpoint.every=1")


pytestmark = pytest.mark.slow  # two full runs of minutes each: make test-slow


def test_lora_run_updates_resumes_evaluates_and_continues(tiny_model, tmp_path):
    run = tmp_path / "lora"
    proc = run_train(run, f"model={tiny_model}", *TINY_RUN, *LORA, "trainer.steps=2", timeout=400)
    assert "LoRA rank 4" in proc.stdout and "carry the adapter alone" in proc.stdout
    rd = RunDir(run)
    updates = [u for u in read_jsonl(rd.weight_updates) if u.get("version", 0) > 0]
    assert updates and all("probe_logp_change" in json.dumps(u) for u in updates), updates
    rows = read_jsonl(rd.metrics)
    assert len(rows) == 2
    assert saved_rank(rd.checkpoint(1) / "adapter") == 4
    final = rd.final
    assert (final / "config.json").is_file() and saved_rank(final / "adapter") == 4
    with safe_open(str(final / "model.safetensors"), "pt") as f:
        assert not any("lora" in k or "base_layer" in k for k in f.keys())  # a plain (merged) model

    # continues the adapter from step 2
    run_train(run, f"resume={run}", "trainer.steps=3", timeout=400)
    assert len(read_jsonl(rd.metrics)) == 3 and saved_rank(rd.final / "adapter") == 4

    ev = subprocess.run(AREAL + ["eval", f"model={run}", "size=4", "max_new_tokens=8"],
                        capture_output=True,
                        text=True, cwd=ROOT, timeout=300)
    assert ev.returncode == 0, ev.stderr
    assert str(rd.final.resolve()) in ev.stdout + ev.stderr or "accuracy" in (ev.stdout
                                                                              + ev.stderr).lower()

    more = tmp_path / "more"
    run_train(more, f"model={rd.final}", *TINY_RUN, "trainer.lora.rank=4", "trainer.steps=1",
              timeout=400)
    assert len(read_jsonl(RunDir(more).metrics)) == 1


def test_lora_under_fsdp2_two_ranks_sends_the_same_adapter_to_every_worker(tiny_model, tmp_path):
    """Two trainer ranks shard the adapted model with FSDP2 (gloo), as on GPUs; the adapter gathered
    from the shards reaches both workers bit-exact (weights.verify hashes both ends), and a
    checkpoint holds it."""
    run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, *LORA, "trainer.steps=2",
              "trainer.ranks=2",
              "rollout.workers=2", "weights.verify=true", "weights.bucket_mb=1", timeout=400)
    sent = {m["version"]: m["weights_sha"] for m in read_jsonl(tmp_path / "metrics.jsonl")}
    loaded = read_jsonl(tmp_path / "weight_updates.jsonl")
    assert {u["worker"] for u in loaded} == {"rollout-0", "rollout-1"} and len(loaded) == 4
    for u in loaded:
        assert u["weights_sha"] == sent[u["version"]], f"{u['worker']} v{u['version']} differs"
    assert (saved_rank(RunDir(tmp_path).checkpoint(1) / "adapter") == 4
            and saved_rank(RunDir(tmp_path).final / "adapter") == 4)

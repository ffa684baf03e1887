"""A step whose gradient norm is not finite keeps its batch (RUN_DIR/nonfinite/), and the trainer
alone replays it with a probe of where the gradient grows (benchmarks/trainer_profile.py --batch
--grad-probe).

The probe's case is the one it was built for: a token whose embedding row is zero (transformers
zeroes the pad token's row at initialisation) at the start of a sequence keeps a zero hidden state
through every layer of a random model, and RMSNorm's backward multiplies its gradient by up to 1 /
sqrt(eps) per layer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from areal_cli.config.schema import TrainerConfig
from areal_cli.trainer.main import KEEP_NONFINITE, keep_nonfinite_batch
from benchmarks.grad_probe import GradProbe, explodes
from benchmarks.trainer_profile import kept_batch
from benchmarks.trainer_variants import batch

ROOT = Path(__file__).resolve().parents[2]
NAN, OK = {"grad_norm": float("nan")}, {"grad_norm": 0.5}


def random_llama(layers: int = 6):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                      pad_token_id=0)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).float()


def probe_of(model, ids: list[int]) -> list[dict]:
    probe = GradProbe(model)
    probe.arm()
    logp = model(torch.tensor([ids])).logits.log_softmax(-1)
    (logp.exp() * logp).sum(-1).mean().backward()  # an entropy bonus's gradient reaches every token
    rows = probe.report()
    probe.remove()
    return rows


def test_the_probe_names_the_zero_hidden_token_where_the_gradient_explodes():
    model = random_llama()
    assert float(model.model.embed_tokens.weight[0].detach().norm()) == 0.0  # the pad token's row
    rng = np.random.default_rng(0)
    rest = rng.integers(1, 64, 40).tolist()
    calm = probe_of(model, [5, *rest])
    assert not explodes(calm)
    model.zero_grad()
    rows = probe_of(model, [0, *rest])
    assert explodes(rows)
    first = rows[-1]  # layer 0
    assert (first["layer"], first["position"], first["token_id"]) == (0, 0, 0)
    assert first["rms_in_at"] == 0.0 and first["grad_max"] > 1e6 * calm[-1]["grad_max"]
    # every layer multiplies it (1-2 without the zero token)
    assert all(r["growth"] > 10 for r in rows[1:])


def test_a_nonfinite_step_keeps_its_batch_and_the_replay_reads_it_back(tmp_path, monkeypatch):
    b = batch(4, 16, ragged=True)
    assert keep_nonfinite_batch(tmp_path, 3, b, OK, TrainerConfig()) is None
    assert keep_nonfinite_batch(tmp_path, 3, b, NAN, TrainerConfig(dtype="float16")) is None
    paths = [keep_nonfinite_batch(tmp_path, s, b, NAN, TrainerConfig()) for s in (4, 5, 6)]
    assert paths[:KEEP_NONFINITE] == [tmp_path / "nonfinite" / "batch_4.msgpack",
                                      tmp_path / "nonfinite" / "batch_5.msgpack"]
    assert paths[KEEP_NONFINITE:] == [None]  # the first ones only
    (tmp_path / "big").mkdir()
    # too large to keep: not written
    monkeypatch.setattr("areal_cli.trainer.main.KEEP_NONFINITE_BYTES", 100)
    assert keep_nonfinite_batch(tmp_path / "big", 1, b, NAN, TrainerConfig()) is None
    assert not (tmp_path / "big" / "nonfinite").exists()
    again = kept_batch(str(paths[0]))
    for g, h in zip(b.groups, again.groups, strict=True):
        for s, t in zip(g.samples, h.samples, strict=True):
            assert np.array_equal(s.prompt_ids, t.prompt_ids) and np.array_equal(s.output_ids,
                                                                                 t.output_ids)
            assert np.array_equal(s.logprobs, t.logprobs) and s.reward == t.reward


@pytest.mark.slow
def test_trainer_profile_replays_a_kept_batch_with_the_probe(tmp_path, tiny_model):
    path = keep_nonfinite_batch(tmp_path, 0, batch(4, 24, ragged=True), NAN, TrainerConfig())
    out = tmp_path / "profile"
    run = subprocess.run([sys.executable, "-m", "benchmarks.trainer_profile", "--arch",
                          str(tiny_model), "--batch",
                          str(path), "--grad-probe", "--rows", "baseline", "--steps", "1",
                          "--profile", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gradient of each decoder layer's output" in run.stdout
    row = json.loads((out / "results.json").read_text())["rows"][0]
    assert [r["layer"] for r in row["grad_probe"]] == [1, 0]
    assert all(np.isfinite(r["grad_max"]) for r in row["grad_probe"])


def test_a_batch_that_cannot_be_written_costs_the_replay_not_the_run(tmp_path):
    (tmp_path / "nonfinite").write_text("a file where the folder goes")
    assert keep_nonfinite_batch(tmp_path, 0, batch(2, 8), NAN, TrainerConfig()) is None

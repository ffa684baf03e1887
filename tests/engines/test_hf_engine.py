"""The embedded engine, both CPU loops (slots, paged), for real: interruption by a
weight update mid-generation, behaviour logprobs vs teacher-forced forwards."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import hf_engine, perturb

from areal_cli.engines.base import Sequence

BATCHINGS = pytest.mark.parametrize("batching", ["slots", "paged"])


def _engine(path, batching):
    return hf_engine(path, cpu_batching=batching)


def _teacher_forced(model, prompt, out):
    ids = torch.tensor([prompt + out])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(out)[:, None])[:, 0]


@BATCHINGS
def test_weight_update_interrupts_and_continues_under_new_weights(tiny_model, batching):
    from transformers import AutoModelForCausalLM

    old = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    new = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    torch.manual_seed(123)
    perturb(new, 0.05)
    eng = _engine(tiny_model, batching)
    prompts = [[1, 9690, 198, 504 + i, 30, 28] for i in range(4)]
    for i, p in enumerate(prompts):
        eng.submit(Sequence(f"s{i}", p, max_new_tokens=48))
    done, deadline = [], time.monotonic() + 60
    while not any(len(s.output_ids) >= 4
                  for s in eng.seqs.values()) and time.monotonic() < deadline:
        done += eng.poll(0.005)

    with eng.paused(1) as stats:
        eng.model.load_state_dict(new.state_dict())
    assert stats["interrupted"] >= 1
    while len(done) < 4 and time.monotonic() < deadline:
        done += eng.poll(0.5)
    eng.close()
    assert len(done) == 4
    spanning = [s for s in done if s.versions[0] == 0 and s.versions[-1] == 1]
    assert spanning, "no sequence was continued across the update"
    for s in spanning:
        cut = s.versions.index(1)
        before = _teacher_forced(old, s.prompt_ids, s.output_ids)[:cut]
        after = _teacher_forced(new, s.prompt_ids, s.output_ids)[cut:]
        got = torch.tensor(s.logprobs)
        assert torch.allclose(got[:cut], before, atol=1e-3), (got[:cut] - before).abs().max()
        assert torch.allclose(got[cut:], after, atol=1e-3), (got[cut:] - after).abs().max()
        assert s.segments == 2


@BATCHINGS
def test_logprobs_match_forward_without_interruption(tiny_model, batching):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    eng = _engine(tiny_model, batching)
    eng.submit(Sequence("a", [1, 9690, 198, 33, 44], max_new_tokens=16))
    out = []
    while not out:
        out = eng.poll(1.0)
    eng.close()
    s = out[0]
    assert s.finish_reason in ("stop", "length") and len(s.output_ids) == len(s.logprobs)
    assert torch.allclose(torch.tensor(s.logprobs),
                          _teacher_forced(ref, s.prompt_ids, s.output_ids),
                          atol=1e-3)


def test_kv_cache_on_a_gpu_fits_the_given_share_of_free_memory(tiny_model, monkeypatch):
    from transformers import AutoConfig

    from areal_cli.engines.hf.engine import kv_tokens_that_fit

    free = 8 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 << 30))
    c = AutoConfig.from_pretrained(tiny_model)
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2  # K and V, bf16
    weights = (12 * c.num_hidden_layers * c.hidden_size ** 2 + c.vocab_size * c.hidden_size) * 2
    half = kv_tokens_that_fit(tiny_model, "cuda:0", torch.bfloat16, 0.5)
    # the share, less the weights, in tokens
    assert half == int((free * 0.5 - weights) // per_token)
    assert kv_tokens_that_fit(tiny_model, "cuda:0", torch.bfloat16, 0.25) < half
    # nothing left: still a usable minimum, the engine then fails loudly if it can't allocate
    free = 1 << 20
    assert kv_tokens_that_fit(tiny_model, "cuda:0", torch.bfloat16, 0.5) == 4096

"""The hf engine's slot loop (CPU) at its edges: many sequences of different lengths arriving,
finishing and being interrupted, with rows moving between slots, the live window moving to the
front of a small cache and the cache growing; weights that are not finite; a spent budget; and
its sampling (top-p, the inverse-CDF draw) against the distribution it claims."""

from __future__ import annotations

import math
import random

import pytest
import torch
from conftest import hf_engine, perturb

from areal_cli.engines.base import Sampling, Sequence
from areal_cli.engines.hf.slots import SlotEngine, sample


def _teacher_forced(model, prompt, out):
    ids = torch.tensor([prompt + out])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(out)[:, None])[:, 0]


def _poll_until(eng, cond, timeout_steps: int, done: list) -> list:
    for _ in range(timeout_steps):
        if cond(done):
            break
        done += eng.poll(0.0)
    return done


def test_arrivals_departures_and_updates_keep_every_logprob_exact(tiny_model):
    """30 sequences through 6 slots of a cache 128 columns wide (the window moves to the front,
    prompts longer than the write column shift the live rows, a 150-token context grows the
    cache), two weight updates mid-way: every logprob equals a teacher-forced forward under the
    version that produced it."""
    from transformers import AutoModelForCausalLM

    models = [AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
              for _ in range(3)]
    torch.manual_seed(5)
    for m in models[1:]:
        perturb(m, 0.05)
    eng = hf_engine(tiny_model, sequences=6, kv_cache_tokens=6 * 32, max_batch_tokens=64)
    assert isinstance(eng, SlotEngine) and eng.cache.columns == 128
    rng = random.Random(0)
    for i in range(30):
        n = 150 if i == 17 else rng.randrange(2, 40)
        eng.submit(Sequence(f"s{i}", [1] + [rng.randrange(3, 40000) for _ in range(n)],
                            rng.randrange(1, 30)))
    done: list = []
    for version in (1, 2):
        _poll_until(eng, lambda d, v=version: len(d) >= 8 * v, 500, done)
        with eng.paused(version) as stats:
            eng.model.load_state_dict(models[version].state_dict())
        assert stats["interrupted"] > 0
    _poll_until(eng, lambda d: len(d) == 30, 2000, done)
    eng.close()
    assert len(done) == 30 and eng.cache.columns > 128
    assert any(s.segments > 1 for s in done) and max(s.versions[-1] for s in done) == 2
    for s in done:
        assert len(s.output_ids) == len(s.logprobs) == len(s.versions) <= s.max_new_tokens
        for v in set(s.versions):
            at = [i for i, x in enumerate(s.versions) if x == v]
            want = _teacher_forced(models[v], s.prompt_ids, s.output_ids)[at]
            got = torch.tensor(s.logprobs)[at]
            assert torch.allclose(got, want, atol=1e-4), (s.rid, v, (got - want).abs().max())


def test_a_groups_samples_share_one_prefill_row_and_keep_every_logprob_exact(tiny_model):
    """4 groups of 4 samples of one prompt each: the prefill forward runs a row per prompt (the
    others copy its keys and values), the samples still draw apart, and every logprob equals a
    teacher-forced forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    eng = hf_engine(tiny_model, sequences=16, temperature=1.0)
    rows: list[int] = []
    eng.model.get_decoder().register_forward_pre_hook(
        lambda _m, _a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True)
    rng = random.Random(1)
    for g in range(4):
        prompt = [1] + [rng.randrange(3, 40000) for _ in range(rng.randrange(5, 20))]
        for i in range(4):
            eng.submit(Sequence(f"g{g}-{i}", list(prompt), 12, ignore_eos=True))
    done = _poll_until(eng, lambda d: len(d) == 16, 500, [])
    eng.close()
    assert len(done) == 16 and rows[0] == 4  # one prefill of the 4 prompts, then 16-row decodes
    assert max(rows) == 16
    for g in range(4):
        outs = {tuple(s.output_ids) for s in done if s.rid.startswith(f"g{g}-")}
        assert len(outs) > 1  # sampled apart from the shared first logits
    for s in done:
        want = _teacher_forced(model, s.prompt_ids, s.output_ids)
        assert torch.allclose(torch.tensor(s.logprobs), want, atol=1e-4), s.rid


def test_nonfinite_weights_stop_generation_with_a_named_error(tiny_model):
    eng = hf_engine(tiny_model)
    for i in range(4):
        eng.submit(Sequence(f"s{i}", [1, 9690, 198, 504 + i], max_new_tokens=200))
    eng.poll(0.0)
    name = "model.layers.0.mlp.down_proj.weight"
    with pytest.raises(RuntimeError,
                       match=f"version 1 are not finite.*{name}"), eng.paused(1), torch.no_grad():
        eng.model.get_parameter(name)[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="not finite"):
        eng.poll(0.01)
    assert not eng.rows and not eng.waiting  # nothing was sampled from the NaN weights
    eng.close()


def test_a_sequence_with_no_budget_left_is_finished_not_resubmitted(tiny_model):
    eng = hf_engine(tiny_model, eos_token_id=-1)
    for i in range(3):
        eng.submit(Sequence(f"s{i}", [1, 9690, 198, 504 + i], max_new_tokens=300))
    _poll_until(eng, lambda _: all(len(s.output_ids) >= 3 for s in eng.seqs.values()), 100, [])
    with eng.paused(1):  # as if s0 had just generated its last token
        seq = eng.seqs["s0"]
        seq.max_new_tokens = len(seq.output_ids)
        spent = list(seq.output_ids)
    done = eng.poll(0.0)
    eng.close()
    assert [s.rid for s in done] == ["s0"]
    assert (done[0].finish_reason == "length" and done[0].segments == 1 and done[0].output_ids
            == spent)


def test_greedy_and_sampled_draws_follow_the_distribution_they_report():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(20000, 1)
    tok, logp = sample(logits[:2], Sampling(0.0))
    assert tok.tolist() == [0, 0] and math.isclose(logp[0].item(),
                                                   torch.log_softmax(logits[0], -1)[0].item())
    t = 0.7
    tok, logp = sample(logits, Sampling(t))
    want = torch.softmax(logits[0] / t, -1)
    freq = torch.bincount(tok, minlength=5).float() / len(tok)
    assert (freq - want).abs().max() < 0.015, (freq, want)
    assert torch.allclose(logp, want.log()[tok], atol=1e-5)
    # p = .64 .24 .09 .03: the nucleus is {0, 1}
    tok, logp = sample(logits, Sampling(1.0, top_p=0.8))
    assert set(tok.tolist()) == {0, 1}
    kept = torch.softmax(logits[0, :2], -1)
    assert torch.allclose(logp, kept.log()[tok], atol=1e-5)

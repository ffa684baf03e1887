"""Packed, left-padded and shared-prompt micro-batches give the same response logprobs and values
(a real tiny model in float32), the shared one the same gradients too, and micro-batches respect the
token budget."""

from __future__ import annotations

import torch
from helpers import make_batch, plain_model

from areal_cli.trainer.batching import (
    forward,
    from_batch,
    micro_batches,
    model_inputs,
    pack,
    share_prompts,
    token_logprobs,
)


def test_packed_equals_padded_logprobs(tiny_model):
    model = plain_model(tiny_model).eval()
    ro = from_batch(make_batch(model, groups=3, group_size=3, seed=1))
    rows = list(range(ro.n))
    out = {}
    with torch.no_grad():
        for packed in (True, False):
            x = model_inputs(ro, rows, packed)
            out[packed] = token_logprobs(forward(model, x, torch.float32), x, temperature=1.0)
    for a, b in zip(out[True], out[False], strict=True):
        assert a.shape == ro.loss_mask.shape
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    # and both equal the behaviour logprobs of an unpadded forward of each sequence alone
    assert torch.allclose(out[True][0], ro.behav_logp, atol=1e-4)
    assert (out[True][0][~ro.loss_mask] == 0).all()


def test_pack_layout():
    # two sequences: prompt [1, 2] + response [3]; prompt [4] + response [5, 6]
    x = pack([[1, 2], [4]], [[3], [5, 6]], width=2)
    assert x.ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert x.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    assert x.keep.tolist() == [1, 3, 4]  # the positions predicting 3, 5 and 6
    assert x.targets.tolist() == [3, 5, 6]
    assert x.valid.tolist() == [[True, False], [True, True]]
    m = x.attention_mask[0, 0]
    assert m[4].tolist() == [False, False, False, True, True, False]  # token 5 sees [4, 5] only


def test_micro_batches_budget():
    lens = [10, 7, 5, 3]
    packed = micro_batches(lens, budget=15, packed=True)
    assert packed == [[0], [1, 2, 3]]  # longest first, next fit: 10, then 7 + 5 + 3 = 15
    padded = micro_batches(lens, budget=15, packed=False)
    assert padded == [[0], [1, 2], [3]]  # rows × longest: 10, 2 × 7 = 14, 3
    assert all(sum(lens[i] for i in mb) <= 15 for mb in packed)
    assert len(micro_batches(lens, budget=100, count=3, packed=True)) == 3


def test_shared_prompts_give_the_padded_logprobs_and_gradients(tiny_model):
    model = plain_model(tiny_model)
    ro = from_batch(make_batch(model, groups=3, group_size=3, seed=2))
    rows = list(range(ro.n))
    weights = torch.randn(ro.loss_mask.shape, generator=torch.Generator().manual_seed(0))
    out, grads = {}, {}
    for shared in (True, False):
        model.zero_grad()
        x = model_inputs(ro, rows, packed=False, shared=shared, buckets=4)
        lp, ent = token_logprobs(forward(model, x, torch.float32), x, temperature=0.7)
        (lp * weights).sum().backward()  # a loss of every token, so every weight gets a gradient
        out[shared] = lp.detach()
        grads[shared] = {n: p.grad.clone() for n, p in model.named_parameters()}
    x = model_inputs(ro, rows, packed=False, shared=True)
    assert x.ids.shape[0] == 3  # one row per group: its prompt once
    assert torch.allclose(out[True], out[False], atol=1e-5), (out[True] - out[False]).abs().max()
    assert (out[True][~ro.loss_mask] == 0).all()
    for name, g in grads[False].items():
        assert torch.allclose(grads[True][name], g, atol=1e-5, rtol=1e-4), name


def test_shared_prompt_layout():
    # prompt [1, 2] with responses [3] and [4, 5]; then prompt [6] with response [7]
    x = share_prompts([[1, 2], [1, 2], [6]], [[3], [4, 5], [7]], width=2)
    assert x.ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 0, 0, 0]]
    assert x.position_ids.tolist() == [[0, 1, 2, 2, 3], [0, 1, 0, 0, 0]]
    assert x.targets.tolist() == [3, 4, 5, 7]
    assert x.keep.tolist() == [0, 1, 3]  # 3 and 4 from position 1 (the prompt's end), 5 from 3
    assert x.rows.tolist() == [0, 0, 0, 1]
    assert x.cols.tolist() == [1, 1, 2, 0]
    m = x.attention_mask[0, 0]
    assert m[3].tolist() == [True, True, False, True, False]  # 4 sees the prompt, not 3
    assert m[4].tolist() == [True, True, False, True, True]
    assert x.valid.tolist() == [[True, False], [True, True], [True, False]]

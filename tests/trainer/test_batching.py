"""Packed and left-padded micro-batches give the same response logprobs and values (a real tiny
model in float32), and micro-batches respect the token budget."""

from __future__ import annotations

import torch
from helpers import make_batch, plain_model

from areal_cli.trainer.batching import (
    forward,
    from_batch,
    micro_batches,
    model_inputs,
    pack,
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

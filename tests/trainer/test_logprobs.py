"""Chunked output layer + log-softmax: the same logprobs, entropies and gradients as one
log-softmax over all positions (float64), and never more than a chunk of positions at once."""

from __future__ import annotations

import pytest
import torch
from helpers import make_batch, plain_model

from areal_cli.trainer.batching import from_batch, model_inputs
from areal_cli.trainer.logprobs import chunked_logprobs, forward_logprobs

F64 = torch.float64


def _unchunked(head, hidden, targets, temperature):
    logp_all = torch.log_softmax(head(hidden) / temperature, dim=-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, targets[:, None])[:, 0], ent


@pytest.mark.parametrize("chunk", [1, 8, 37, 1024])
def test_chunked_equals_one_log_softmax_values_and_gradients(chunk):
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=True).to(F64)
    hidden = torch.randn(37, 16, dtype=F64, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (37,), generator=gen)
    weights = torch.randn(37, dtype=F64, generator=gen)  # an arbitrary upstream gradient

    grads = []
    for fn in (_unchunked, lambda *a: chunked_logprobs(*a, chunk=chunk)):
        head.zero_grad()
        hidden.grad = None
        lp, ent = fn(head, hidden, targets, 0.7)
        (lp * weights).sum().backward()
        grads.append((lp.detach(), ent.detach(), hidden.grad.clone(), head.weight.grad.clone(),
                      head.bias.grad.clone()))
    (lp0, ent0, *g0), (lp1, ent1, *g1) = grads
    assert lp1.dtype == F64 and not ent1.requires_grad
    assert torch.allclose(lp1, lp0, rtol=0, atol=1e-6) and torch.allclose(ent1, ent0, rtol=0,
                                                                          atol=1e-6)
    for a, b in zip(g1, g0, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
    assert float(g0[1].abs().sum()) > 0


def test_chunked_rejects_a_chunk_below_one():
    with pytest.raises(ValueError, match="logprob_chunk_tokens must be at least 1"):
        chunked_logprobs(torch.nn.Identity(), torch.zeros(2, 3), torch.zeros(2, dtype=torch.long),
                         1.0, 0)


def _sequence_logprobs(model, ro, temperature):
    """log softmax(logits / T) of each response token from an unpadded float64 forward of each
    sequence alone, as an ``[N, L]`` tensor (0 past the response)."""
    out = torch.zeros(ro.loss_mask.shape, dtype=F64)
    rows = []
    for i, (p, r) in enumerate(zip(ro.prompts, ro.responses, strict=True)):
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:-1]
        lp = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(r)[:, None])[:, 0]
        rows.append((i, lp))
    for i, lp in rows:
        out = out.index_put((torch.full((len(lp),), i), torch.arange(len(lp))), lp)
    return out


@pytest.mark.parametrize("packed", [True, False])
def test_forward_logprobs_equals_per_sequence_float64(tiny_model, packed):
    # the whole path (padded or packed inputs, kept positions, the swapped output layer, chunks
    # of 3 positions) against a plain float64 forward of each sequence; gradients of every
    # parameter of Σ w·logp match, and the output layer never sees more than 3 positions
    model = plain_model(tiny_model).to(F64)
    ro = from_batch(make_batch(plain_model(tiny_model), groups=2, group_size=3, seed=1))
    weights = torch.randn(ro.loss_mask.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    head = model.get_output_embeddings()
    seen = []

    def counting(h, inner=head.forward):
        seen.append(h.shape[0])
        return inner(h)

    head.forward = counting  # an instance override, as float32_head installs: kept and used
    x = model_inputs(ro, list(range(ro.n)), packed)
    lp, ent = forward_logprobs(model, x, torch.float32, 0.9, chunk=3)
    assert head.forward is counting
    (lp * weights).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    # forward + recompute
    assert seen and max(seen) <= 3 and sum(seen) == 2 * int(ro.loss_mask.sum())

    model.zero_grad()
    want = _sequence_logprobs(model, ro, 0.9)
    (want * weights).sum().backward()
    assert lp.dtype == F64 and torch.allclose(lp, want, rtol=0, atol=1e-6), (lp - want).abs().max()
    assert (ent[ro.loss_mask] > 0).all() and (ent[~ro.loss_mask] == 0).all()
    for name, p in model.named_parameters():
        assert torch.allclose(got[name], p.grad, rtol=1e-6, atol=1e-9), name

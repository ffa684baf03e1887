"""Shape buckets (trainer.shape_buckets): padded micro-batches and the output layer's last chunk
are rounded up to a few sizes, and the logprobs, the loss and every gradient stay those of the
exact shapes (a real tiny model: float64 for the logprobs, float32 for the trainer step)."""

from __future__ import annotations

import pytest
import torch
from helpers import grads, init_gloo, make_batch, plain_model, step_runner

from areal_cli.trainer.batching import bucket, from_batch, micro_batches, model_inputs
from areal_cli.trainer.logprobs import forward_logprobs

F64 = torch.float64


def test_bucket_sizes():
    # 4 per doubling: (64, 128] in steps of 16, (128, 256] in steps of 32
    assert [bucket(n, 4) for n in (1, 4, 5, 9, 65, 80, 81, 128, 129)] == [1, 4, 5, 10, 80, 80, 96,
                                                                          128, 160]
    assert [bucket(n, 1) for n in (3, 5, 9, 100)] == [4, 8, 16, 128]  # powers of two
    assert [bucket(n, 0) for n in (3, 65, 129)] == [3, 65, 129]  # off: exact


def test_padded_budget_counts_the_bucketed_shape():
    # rows × longest: 3 × 9 = 27 fits 30; bucketed (powers of two) 9 is 16 wide and 2 × 16 = 32
    # does not, while 8 stays 8 wide: 2 × 8 = 16 does
    lens = [9, 8, 8]
    assert micro_batches(lens, budget=30) == [[0, 1, 2]]
    assert micro_batches(lens, budget=30, buckets=1) == [[0], [1, 2]]


def test_bucketed_inputs_give_the_exact_logprobs_and_gradients(tiny_model):
    # 5 sequences, 1 bucket per doubling (powers of two): 8 rows (3 one-token dummies), a wider
    # left padding, and the output layer's chunks of 3 positions padded to 4
    model = plain_model(tiny_model).to(F64)
    ro = from_batch(make_batch(plain_model(tiny_model), groups=1, group_size=5, seed=4))
    weights = torch.randn(ro.loss_mask.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    head = model.get_output_embeddings()
    seen: list[int] = []

    def counting(h, inner=head.forward):
        seen.append(h.shape[0])
        return inner(h)

    head.forward = counting
    out = {}
    for buckets in (0, 1):
        seen.clear()
        model.zero_grad()
        x = model_inputs(ro, list(range(ro.n)), packed=False, buckets=buckets)
        lp, ent = forward_logprobs(model, x, torch.float32, 0.9, chunk=3, buckets=buckets)
        (lp * weights).sum().backward()
        out[buckets] = (x.ids.shape, list(seen), lp.detach(), ent,
                        {n: p.grad.clone() for n, p in model.named_parameters()})
    (shape0, seen0, lp0, ent0, g0), (shape1, seen1, lp1, ent1, g1) = out[0], out[1]
    assert shape0[0] == 5 and shape1[0] == 8 and shape1[1] == bucket(shape0[1], 1) > shape0[1]
    assert seen1 == [bucket(n, 1) for n in seen0] and seen1 != seen0
    assert torch.allclose(lp1, lp0, rtol=0, atol=1e-12) and torch.allclose(ent1, ent0, rtol=0,
                                                                           atol=1e-12)
    assert (lp1[~ro.loss_mask] == 0).all()
    for name in g0:
        assert torch.allclose(g1[name], g0[name], rtol=1e-9, atol=1e-12), name
    assert sum(float(g.abs().sum()) for g in g0.values()) > 0


@pytest.fixture(scope="module")
def gloo():
    init_gloo()


def _step(path, batch, buckets: int):
    runner = step_runner(path, "algorithm=grpo", "trainer.packing=false", "trainer.grad_clip=1e9",
                         f"trainer.shape_buckets={buckets}")
    metrics = runner.train(batch)
    return metrics, grads(runner.model)


def test_trainer_step_loss_and_gradients_do_not_depend_on_buckets(tiny_model, gloo):
    batch = make_batch(plain_model(tiny_model), groups=3, group_size=3, seed=5)
    (m0, g0), (m1, g1) = _step(tiny_model, batch, 0), _step(tiny_model, batch, 1)
    assert m0["micro_batches"] == m1["micro_batches"] == 1
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-5, abs=1e-7) and m0["loss"] != 0
    assert m1["grad_norm"] == pytest.approx(m0["grad_norm"], rel=1e-5)
    for name in g0:
        assert torch.allclose(g1[name], g0[name], rtol=1e-4, atol=1e-7), name

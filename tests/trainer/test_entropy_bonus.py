"""``algorithm.entropy_coef`` reaches the weights: the entropy bonus's gradient flows through the
chunked output layer, equal to that of a plain full-vocabulary entropy of each sequence."""

from __future__ import annotations

import pytest
import torch
from helpers import grads as _grads
from helpers import init_gloo, make_batch, plain_model, step_runner

from areal_cli.trainer.logprobs import chunked_logprobs

F64 = torch.float64


@pytest.fixture(scope="module", autouse=True)
def gloo():
    init_gloo()


def test_chunked_entropy_gradient_equals_one_log_softmax():
    gen = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(16, 50).to(F64)
    hidden = torch.randn(29, 16, dtype=F64, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (29,), generator=gen)
    weights = torch.randn(29, dtype=F64, generator=gen)
    grads = []
    for chunked in (False, True):
        head.zero_grad()
        hidden.grad = None
        if chunked:
            _, ent = chunked_logprobs(head, hidden, targets, 0.8, chunk=8, entropy_grad=True)
        else:
            logp = torch.log_softmax(head(hidden) / 0.8, -1)
            ent = -(logp.exp() * logp).sum(-1)
        (ent * weights).sum().backward()
        grads.append((hidden.grad.clone(), head.weight.grad.clone()))
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-9)
    assert float(grads[0][1].abs().sum()) > 0
    # without entropy_grad the entropy stays a logged number, as before
    assert not chunked_logprobs(head, hidden, targets, 0.8, chunk=8)[1].requires_grad


def _runner(path, *overrides: str, checkpointing: bool = False):
    return step_runner(path, "algorithm=grpo", "algorithm.loss_agg=token_mean",
                       "trainer.grad_clip=1e9",
                       "trainer.lr=1e-12", *overrides, checkpointing=checkpointing)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_entropy_bonus_is_the_only_gradient_of_a_zero_advantage_batch(tiny_model, checkpointing):
    # every group got equal rewards, so every advantage is 0: the policy term's gradient is 0,
    # and with entropy_coef = c the step's gradient is -c * d(mean token entropy)/dθ (also with
    # the layers' activation checkpointing, the CPU default)
    coef = 0.05
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=4,
                       rewards=[1.0, 1.0, 0.0, 0.0])
    runner = _runner(tiny_model, f"algorithm.entropy_coef={coef}", checkpointing=checkpointing)
    out = runner.train(batch)
    assert out["skipped_rows"] == 0
    got = _grads(runner.model)

    model = plain_model(tiny_model)
    model.zero_grad()
    total, tokens = 0.0, 0
    for g in batch.groups:
        for s in g.samples:
            p, r = s.prompt_ids.tolist(), s.output_ids.tolist()
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:-1]
            logp = torch.log_softmax(logits / runner.cfg.rollout.temperature, -1)
            total = total + (-(logp.exp() * logp).sum(-1)).sum()
            tokens += len(r)
    (-coef * total / tokens).backward()
    for name, p in model.named_parameters():
        want = p.grad
        err = float((got[name] - want).abs().max())
        assert err <= 1e-4 * float(want.abs().max()) + 1e-9, (name, err)
    assert sum(float(g.abs().sum()) for g in got.values()) > 0

    # the same batch without the bonus: no gradient at all
    plain = _runner(tiny_model, "trainer.skip_zero_advantage=false")
    plain.train(batch)
    assert all(float(g.abs().max()) == 0.0 for g in _grads(plain.model).values())


def _nan_in_backward(runner) -> None:
    """The last decoder layer's output gradient turns NaN in backward (its forward stays finite)."""
    def hook(_module, _inputs, out):
        hidden = out[0] if isinstance(out, tuple) else out
        hidden.register_hook(lambda grad: grad * float("nan"))

    runner.model.model.layers[-1].register_forward_hook(hook)


def test_detect_anomaly_names_the_operation_where_a_nan_gradient_starts(tiny_model):
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=4)
    plain = _runner(tiny_model, "algorithm.entropy_coef=0.05")
    _nan_in_backward(plain)
    out = plain.train(batch)  # without it: the step is skipped and the weights are kept
    assert out["skipped_steps"] == 1 and out["grad_norm"] != out["grad_norm"]
    runner = _runner(tiny_model, "algorithm.entropy_coef=0.05", "trainer.detect_anomaly=true")
    _nan_in_backward(runner)
    with pytest.raises(RuntimeError,
                       match=r"trainer.detect_anomaly: Function '\w+' returned nan values"):
        runner.train(batch)

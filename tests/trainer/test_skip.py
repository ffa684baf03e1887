"""Rows whose every advantage is 0 never reach the policy's forward (nor its backward), and the
loss and every gradient equal those of the unskipped computation."""

from __future__ import annotations

import pytest
import torch
from helpers import grads as _grads
from helpers import init_gloo, make_batch, plain_model, step_runner


@pytest.fixture(scope="module", autouse=True)
def gloo():
    init_gloo()


def _runner(path, *overrides: str):
    return step_runner(path, "algorithm=grpo", "trainer.grad_clip=1e9", "trainer.lr=1e-12",
                       *overrides)


def _count_rows(model, packed: bool = False) -> list[int]:
    """Rows of every input that reaches the model's forward (packed: one per sequence; shared
    prompts: one per group)."""
    seen: list[int] = []

    def hook(_module, _args, kwargs):
        seen.append(int(kwargs["position_ids"].eq(0).sum())
                    if packed else kwargs["input_ids"].shape[0])

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


@pytest.mark.parametrize("layout", ["padded", "packed", "shared"])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_zero_advantage_group_is_skipped_and_changes_nothing(tiny_model, layout, agg):
    # 3 groups of 2: group 1 got reward 1 twice, so its GRPO advantages are 0 at every token;
    # its 2 rows never reach the forward, and the loss (whose denominators still count its
    # tokens and sequences) and every gradient equal the unskipped step's
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    batch = make_batch(plain_model(tiny_model), groups=3, group_size=2, seed=8, rewards=rewards)
    gen = torch.Generator().manual_seed(8)
    # off-policy: behaviour weights ≠ 1, loss ≠ 0
    for s in (s for g in batch.groups for s in g.samples):
        s.logprobs += 0.3 * torch.rand(len(s.logprobs), generator=gen).numpy()
    over = (f"trainer.packing={layout == 'packed'}",
            f"trainer.shared_prompts={layout == 'shared'}", f"algorithm.loss_agg={agg}")
    skip, full = _runner(tiny_model, *over), _runner(tiny_model, *over,
                                                     "trainer.skip_zero_advantage=false")
    packed = layout == "packed"
    rows_skip, rows_full = _count_rows(skip.model, packed), _count_rows(full.model, packed)
    got, want = skip.train(batch), full.train(batch)
    # a row per sequence (4 of 6 forwarded), or per group with shared prompts (2 of 3)
    assert (sum(rows_skip), sum(rows_full)) == ((2, 3) if layout == "shared" else (4, 6))
    group1_tokens = sum(len(s.output_ids) for s in batch.groups[1].samples)
    assert (got["skipped_rows"], got["skipped_tokens"]) == (2, group1_tokens)
    assert (want["skipped_rows"], want["skipped_tokens"]) == (0, 0)
    assert got["trained_tokens"] == want["trained_tokens"]
    # float32 sums of O(1) terms that cancel to ~1e-3: agreement to 1e-6 absolute
    assert got["loss"] == pytest.approx(want["loss"], rel=0, abs=1e-6) and abs(want["loss"]) > 1e-3
    g_skip, g_full = _grads(skip.model), _grads(full.model)
    # float32: the other rows' padded shapes differ, so rounding does
    for name, g in g_full.items():
        err = float((g_skip[name] - g).abs().max())
        assert err <= 1e-5 * float(g.abs().max()), (name, err)
    assert sum(float(g.abs().sum()) for g in g_full.values()) > 0


def test_every_row_skipped_still_gives_zero_gradients(tiny_model):
    # every group uniform: no row is forwarded, one zero-weight dummy micro-batch gives every
    # parameter a zero gradient (not None), so AdamW's step is the unskipped one
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=9,
                       rewards=[1.0, 1.0, 0.0, 0.0])
    runner = _runner(tiny_model)
    rows = _count_rows(runner.model)
    out = runner.train(batch)
    assert out["skipped_rows"] == 4 and out["micro_batches"] == 1 and out["loss"] == 0.0
    assert rows == [1]  # the dummy's one row
    assert all(float(g.abs().max()) == 0.0 for g in _grads(runner.model).values())
    # the step still reports the loss statistics (as 0), like every other step
    assert all(out[k] == 0.0
               for k in ("approx_kl", "clip_fraction", "entropy", "behav_weight_max")), out


def test_no_skipping_with_an_entropy_or_kl_loss_term(tiny_model):
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=9,
                       rewards=[1.0, 1.0, 0.0, 1.0])
    for over in ("algorithm.entropy_coef=0.01", "algorithm.kl_coef=0.1"):
        out = _runner(tiny_model, over).train(batch)
        assert out["skipped_rows"] == 0, over
    assert _runner(tiny_model).train(batch)["skipped_rows"] == 2


def test_a_step_skipped_for_a_non_finite_gradient_is_said_in_the_log(caplog):
    """The optimizer step skipped for a NaN/inf gradient norm (weights unchanged) is a warning
    naming the step and the count, not only a metric; a finite norm says nothing."""
    import logging
    import types

    from areal_cli.trainer.main import Trainer

    log = logging.getLogger("areal-test-skip")
    me = types.SimpleNamespace(log=log)
    with caplog.at_level(logging.WARNING, logger="areal-test-skip"):
        Trainer._warn_skipped(me, 0, {"grad_norm": 0.5, "skipped_steps": 0})
        assert not caplog.records
        Trainer._warn_skipped(me, 3, {"grad_norm": float("nan"), "skipped_steps": 2})
    assert "step 3: gradient norm nan" in caplog.text and "2 step(s) skipped" in caplog.text

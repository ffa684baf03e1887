"""Advantage estimators against plain float64 loop references, on ragged right-padded batches."""

import math

import pytest
import torch

from areal_cli.config.algorithm import AlgorithmConfig
from areal_cli.trainer.advantages import (
    GAE_CHUNK,
    batch_normalize,
    compute_advantages,
    gae,
    group_advantages,
)

EPS = 1e-6


def assert_rel(actual, expected, tol=1e-6):
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert actual.shape == expected.shape
    scale = expected.abs().max().clamp(min=1e-12)
    err = ((actual - expected).abs().max() / scale).item()
    assert err < tol, f"max relative error {err:.3e}"


def ragged_batch(n, length, seed):
    """Right-padded mask with ragged lengths (one full row, one of length 1) and a generator."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (n,), generator=gen)
    lengths[0], lengths[-1] = length, 1
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return mask, lengths.tolist(), gen


def garbage_padded(values, mask, gen):
    """values on valid tokens, large finite junk on padding (must be ignored)."""
    junk = 1e3 * torch.randn(values.shape, generator=gen, dtype=values.dtype)
    return torch.where(mask, values, junk)


def pop_std(xs):
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def ref_group(rewards, estimator):
    flat = [r for group in rewards for r in group]
    batch_mean, batch_std = sum(flat) / len(flat), pop_std(flat)
    out = []
    for group in rewards:
        g, mean = len(group), sum(group) / len(group)
        row = []
        for r in group:
            if estimator == "grpo":
                row.append((r - mean) / (pop_std(group) + EPS))
            elif estimator == "dr_grpo":
                row.append(r - mean)
            elif estimator == "rloo":
                row.append(r - (sum(group) - r) / (g - 1))
            elif estimator == "reinforce_pp":
                row.append((r - batch_mean) / (batch_std + EPS))
            else:
                centered = [x - m for grp in rewards for m in [sum(grp) / len(grp)] for x in grp]
                row.append((r - mean) / (pop_std(centered) + EPS))
        out.append(row)
    return out


@pytest.mark.parametrize(
    "estimator", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
)
def test_group_advantages_match_reference(estimator):
    rewards = torch.randn(4, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = ref_group(rewards.tolist(), estimator)
    assert_rel(group_advantages(rewards, estimator), expected)


def test_grpo_by_hand():
    # group [1, 0, 0, 1]: mean 0.5, population std 0.5, so the advantages are
    # (r - 0.5) / 0.5 = [1, -1, -1, 1] (up to the eps in the denominator).
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64), "grpo")
    assert_rel(adv, [[1.0, -1.0, -1.0, 1.0]], tol=1e-5)


def test_rloo_by_hand():
    # group [1, 0, 0]: the first sees a baseline of mean(0, 0) = 0 -> 1; the others see
    # mean(1, 0) = 0.5 -> -0.5. Dr.GRPO subtracts the full mean 1/3 instead.
    rewards = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    assert_rel(group_advantages(rewards, "rloo"), [[1.0, -0.5, -0.5]])
    assert_rel(group_advantages(rewards, "dr_grpo"), [[2 / 3, -1 / 3, -1 / 3]])


def test_group_errors():
    with pytest.raises(ValueError, match="group size"):
        group_advantages(torch.ones(3, 1), "rloo")
    with pytest.raises(ValueError, match="unknown"):
        group_advantages(torch.ones(3, 2), "ppo")


def ref_gae(rewards, values, lengths, gamma, lam):
    advs, rets = [], []
    for r, v, n in zip(rewards, values, lengths, strict=True):
        adv, last = [0.0] * len(r), 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else 0.0
            last = r[t] + gamma * next_v - v[t] + gamma * lam * last
            adv[t] = last
        advs.append(adv)
        rets.append([adv[t] + v[t] if t < n else 0.0 for t in range(len(r))])
    return advs, rets


@pytest.mark.parametrize(
    "length,gamma,lam",
    [(9, 0.99, 0.95), (9, 1.0, 1.0), (9, 0.9, 0.0), (GAE_CHUNK * 2 + 37, 1.0, 0.97)],
)
def test_gae_matches_reversed_loop(length, gamma, lam):
    mask, lengths, gen = ragged_batch(6, length, seed=length)
    rewards = garbage_padded(torch.randn(6, length, generator=gen, dtype=torch.float64), mask, gen)
    values = garbage_padded(torch.randn(6, length, generator=gen, dtype=torch.float64), mask, gen)
    adv, ret = gae(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = ref_gae(rewards.tolist(), values.tolist(), lengths, gamma, lam)
    assert_rel(adv, ref_adv)
    assert_rel(ret, ref_ret)


def test_gae_by_hand():
    # rewards [0, 1], values [0.5, 0.5], gamma = lam = 1, then padding.
    # delta_1 = 1 + 0 (no value after the end) - 0.5 = 0.5; delta_0 = 0 + 0.5 - 0.5 = 0;
    # A = [0 + 0.5, 0.5] = [0.5, 0.5]; returns = A + V = [1, 1]; padding stays 0.
    rewards = torch.tensor([[0.0, 1.0, 7.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.5, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    adv, ret = gae(rewards, values, mask, 1.0, 1.0)
    assert_rel(adv, [[0.5, 0.5, 0.0]])
    assert_rel(ret, [[1.0, 1.0, 0.0]])


def test_batch_normalize_matches_reference():
    mask, lengths, gen = ragged_batch(5, 7, seed=3)
    adv = garbage_padded(torch.randn(5, 7, generator=gen, dtype=torch.float64), mask, gen)
    valid = [a for row, n in zip(adv.tolist(), lengths, strict=True) for a in row[:n]]
    mean, std = sum(valid) / len(valid), pop_std(valid)
    expected = [
        [(a - mean) / (std + EPS) if t < n else 0.0 for t, a in enumerate(row)]
        for row, n in zip(adv.tolist(), lengths, strict=True)
    ]
    assert_rel(batch_normalize(adv, mask), expected)


def test_compute_advantages_group_with_kl_in_reward():
    cfg = AlgorithmConfig(adv_estimator="grpo", kl_in_reward=True, kl_coef=0.1, gamma=0.9)
    mask, lengths, gen = ragged_batch(6, 8, seed=4)
    rewards = torch.randn(6, generator=gen, dtype=torch.float64)
    kl = garbage_padded(torch.rand(6, 8, generator=gen, dtype=torch.float64), mask, gen)
    adv, returns = compute_advantages(rewards, mask, cfg, group_size=3, kl=kl)
    assert returns is None
    per_seq = [a for g in ref_group(rewards.view(2, 3).tolist(), "grpo") for a in g]
    for i, n in enumerate(lengths):
        for t in range(8):
            to_go = sum(-0.1 * kl[i, k].item() * 0.9 ** (k - t) for k in range(t, n))
            expected = per_seq[i] + to_go if t < n else 0.0
            assert abs(adv[i, t].item() - expected) <= 1e-9 * max(1.0, abs(expected))


def test_compute_advantages_gae_puts_outcome_on_last_token():
    cfg = AlgorithmConfig(adv_estimator="gae", gamma=0.95, lam=0.9, adv_norm_batch=True)
    mask, lengths, gen = ragged_batch(4, 6, seed=5)
    rewards = torch.randn(4, generator=gen, dtype=torch.float64)
    values = garbage_padded(torch.randn(4, 6, generator=gen, dtype=torch.float64), mask, gen)
    adv, returns = compute_advantages(rewards, mask, cfg, group_size=2, values=values)
    token_rewards = [
        [rewards[i].item() if t == n - 1 else 0.0 for t in range(6)] for i, n in enumerate(lengths)
    ]
    ref_adv, ref_ret = ref_gae(token_rewards, values.tolist(), lengths, 0.95, 0.9)
    assert_rel(returns, ref_ret)
    assert_rel(adv, batch_normalize(torch.tensor(ref_adv, dtype=torch.float64), mask))

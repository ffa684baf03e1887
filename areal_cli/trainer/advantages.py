"""Advantage estimators: the group family (GRPO, Dr.GRPO, RLOO, REINFORCE++) and GAE.

Layout conventions shared with ``loss.py``:

* a batch holds N = B * G trajectories, the G trajectories of a prompt group in
  consecutive rows;
* token tensors are ``[N, L]`` and right-padded: ``mask[i, t]`` is True for the response
  tokens of trajectory i and False after its end (the mask is a prefix of each row).

The trainer calls these on the whole training batch on every rank (they are cheap), so
nothing here needs a collective.

Standard deviations are population std (``unbiased=False``): well defined for a group of
one, and what the float64 references in ``tests/trainer`` compute.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal_cli.config.algorithm import AlgorithmConfig

GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
GAE_CHUNK = 512
"""Positions per discount-matrix block in ``gae`` (bounds memory at GAE_CHUNK**2)."""


def group_advantages(rewards: Tensor, estimator: str, eps: float = 1e-6) -> Tensor:
    """Advantages ``[B, G]`` of outcome rewards ``[B, G]`` (B groups of G trajectories).

    grpo: (r - group mean) / (group std + eps); dr_grpo: r - group mean;
    rloo: r - mean of the other G - 1 rewards of the group;
    reinforce_pp: (r - batch mean) / (batch std + eps) over all B * G rewards;
    reinforce_pp_baseline: subtract the group mean, then divide by the batch std + eps.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, group_size], got shape {tuple(rewards.shape)}")
    group_mean = rewards.mean(dim=1, keepdim=True)
    if estimator == "grpo":
        return (rewards - group_mean) / (rewards.std(dim=1, unbiased=False, keepdim=True) + eps)
    if estimator == "dr_grpo":
        return rewards - group_mean
    if estimator == "rloo":
        g = rewards.shape[1]
        if g < 2:
            raise ValueError("rloo needs a group size >= 2; raise the group size or use grpo")
        return g / (g - 1) * (rewards - group_mean)  # r - (sum - r) / (g - 1)
    if estimator == "reinforce_pp":
        return (rewards - rewards.mean()) / (rewards.std(unbiased=False) + eps)
    if estimator == "reinforce_pp_baseline":
        centered = rewards - group_mean
        return centered / (centered.std(unbiased=False) + eps)
    raise ValueError(f"unknown group estimator {estimator!r}; use one of {GROUP_ESTIMATORS}")


def _discounted_suffix_sums(x: Tensor, decay: float) -> Tensor:
    """out[:, t] = sum_{k >= t} decay**(k - t) * x[:, k], block by block without underflow.

    Inside a block of GAE_CHUNK positions a discount matrix does the sum; one carry term
    per block (decay**(distance) * out at the next block's first position) links blocks,
    so the Python loop runs over blocks, not positions.
    """
    n, length = x.shape
    out = torch.empty_like(x)
    carry = x.new_zeros(n)
    for end in range(length, 0, -GAE_CHUNK):
        start = max(0, end - GAE_CHUNK)
        size = end - start
        pos = torch.arange(size, device=x.device, dtype=x.dtype)
        gap = pos[None, :] - pos[:, None]  # [t, k] = k - t
        discount = torch.where(gap >= 0, torch.full_like(gap, decay) ** gap.clamp(min=0), 0.0)
        block = x[:, start:end] @ discount.T
        block = block + carry[:, None] * decay ** (size - pos)[None, :]
        out[:, start:end] = block
        carry = block[:, 0]
    return out


def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation on right-padded ``[N, L]`` tensors.

    delta_t = r_t + gamma * V_{t+1} - V_t with V = 0 after each trajectory's last token;
    A_t = sum_k (gamma * lam)**k * delta_{t+k}; returns = A + V. Both are 0 on padding.
    """
    mask_f = mask.to(values.dtype)
    values = values * mask_f
    next_values = torch.cat([values[:, 1:], values.new_zeros(values.shape[0], 1)], dim=1)
    deltas = (token_rewards + gamma * next_values - values) * mask_f
    advantages = _discounted_suffix_sums(deltas, gamma * lam) * mask_f
    return advantages, (advantages + values) * mask_f


def batch_normalize(adv: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """(adv - mean) / (std + eps), mean and population std over valid tokens; 0 on padding."""
    mask_f = mask.to(adv.dtype)
    count = mask_f.sum().clamp(min=1.0)
    mean = (adv * mask_f).sum() / count
    var = (((adv - mean) * mask_f) ** 2).sum() / count
    return (adv - mean) / (var.sqrt() + eps) * mask_f


def outcome_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """``[N, L]`` token rewards holding each outcome reward ``[N]`` at its last valid token."""
    last = (mask.sum(dim=1) - 1).clamp(min=0)
    has_tokens = mask.any(dim=1).to(rewards.dtype)
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    out.scatter_(1, last[:, None], (rewards * has_tokens)[:, None])
    return out


def _episode_rewards(rewards: Tensor, episodes: Tensor | None) -> Tensor:
    """``[E]`` one reward per episode: the reward of its last row (rows of an episode are
    consecutive)."""
    if episodes is None:
        return rewards
    last = episodes != torch.cat([episodes[1:], episodes.new_full((1,), -1)])
    out = torch.zeros(int(episodes.max()) + 1, dtype=rewards.dtype)
    out[episodes[last]] = rewards[last]
    return out


def compute_advantages(
    rewards: Tensor,
    mask: Tensor,
    cfg: AlgorithmConfig,
    *,
    group_size: int,
    values: Tensor | None = None,
    kl: Tensor | None = None,
    episodes: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per-token advantages ``[N, L]`` (and GAE returns, else None) for a whole batch.

    rewards: ``[N]`` shaped outcome rewards (after ``loss.shape_rewards``), groups in
    consecutive rows. values: ``[N, L]`` critic values, required by gae. kl: ``[N, L]``
    per-token ``loss.kl_penalty(logp_behav_or_prox, ref_logp)``, used when
    ``cfg.kl_in_reward``: the token rewards become ``-kl_coef * kl`` plus the outcome at the
    last token. For gae these feed the TD errors; for the group estimators the KL part
    enters as its discounted return-to-go added to the broadcast group advantage.
    episodes: ``[N]`` batch-wide episode of each row (workflow=agent: an episode may be several
    rows, consecutive, sharing its reward); the group estimators then compare episodes,
    ``group_size`` per group, each taking the reward of its last row; None: one episode per row.
    (workflow.agent_credit=last is applied before: the rollout worker sends an episode's last
    trajectory alone.)
    """
    kl_rewards = None
    if cfg.kl_in_reward and cfg.kl_coef > 0:
        if kl is None:
            raise ValueError("algorithm.kl_in_reward is set but no per-token kl was given")
        kl_rewards = -cfg.kl_coef * kl * mask.to(kl.dtype)
    returns = None
    if cfg.adv_estimator == "gae":
        if values is None:
            raise ValueError("adv_estimator=gae needs critic values")
        token_rewards = outcome_token_rewards(rewards, mask)
        if kl_rewards is not None:
            token_rewards = token_rewards + kl_rewards
        adv, returns = gae(token_rewards, values, mask, cfg.gamma, cfg.lam)
    else:
        if _episode_rewards(rewards, episodes).numel() % group_size:
            raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
        per_seq = group_advantages(_episode_rewards(rewards, episodes).view(-1, group_size),
                                   cfg.adv_estimator).reshape(-1)
        if episodes is not None:
            per_seq = per_seq[episodes]
        adv = per_seq[:, None] * mask.to(per_seq.dtype)
        if kl_rewards is not None:
            zeros = torch.zeros_like(kl_rewards)
            adv = adv + gae(kl_rewards, zeros, mask, cfg.gamma, 1.0)[0]
    if cfg.adv_norm_batch:
        adv = batch_normalize(adv, mask)
    return adv, returns

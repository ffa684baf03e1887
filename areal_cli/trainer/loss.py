"""The one policy loss (decoupled PPO), its regularizers, aggregation and reward shaping.

Token tensors are ``[N, L]``, right-padded, with ``mask`` True on response tokens (see
``advantages.py``). Three logprob tensors meet here:

* ``behav_logp`` (mu): recorded by the rollout engine when the token was generated;
* ``prox_logp`` (pi_prox): the trainer's weights before this step, recomputed once per step;
* ``logp`` (pi_theta): the weights being optimized, carrying the gradient.

Micro-batching: the trainer splits a global batch into micro-batches (and across ranks).
Every aggregated quantity here takes the GLOBAL denominators and returns this
micro-batch's contribution, so the sum of contributions is the loss of the whole batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal_cli.config.algorithm import AlgorithmConfig

POLICY_STATS = ("pg_loss", "approx_kl", "behav_weight_mean", "behav_weight_max", "clip_fraction",
                "dual_clip_fraction", "masked_fraction", "entropy")
"""The statistics every policy micro-step reports: a rank that trained no row (all skipped) reports
them as 0, so every step has the same metrics and every rank all-reduces the same keys."""

STAT_REDUCTIONS = {
    "pg_loss": "sum",
    "clip_fraction": "mean",
    "dual_clip_fraction": "mean",
    "approx_kl": "mean",
    "behav_weight_mean": "mean",
    "behav_weight_max": "max",
    "masked_fraction": "mean",
    "kl_ref": "mean",
    "entropy": "mean",
    "value_loss": "sum",
    "value_clip_fraction": "mean",
}
"""How to combine each stat over micro-batches and ranks.

sum: the value is already a loss contribution; add them up.
mean: the value is a sum over this micro-batch's valid tokens; add them up, then divide
by the global number of valid tokens.
max: take the maximum.

clip_fraction counts tokens whose clipped branch is active; dual_clip_fraction those where
the dual clip bound is; approx_kl sums 0.5 * (log pi_theta - log pi_prox)**2;
behav_weight_mean sums the applied (capped) weight pi_prox/mu; behav_weight_max is the
largest weight before the cap; masked_fraction counts tokens dropped by the behaviour mask;
kl_ref sums the per-token KL to the reference; entropy sums the per-token entropy.
"""


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    """x on valid tokens, 0 on padding (also where padding holds inf or nan)."""
    return torch.where(mask, x, torch.zeros_like(x))


def _seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over each row's valid tokens ``[N]``; 0 for an empty row."""
    return _masked(x, mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1).to(x.dtype)


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: str,
    *,
    global_tokens: float,
    global_seqs: float,
    max_len: int,
) -> Tensor:
    """This micro-batch's share of the batch loss ``per_token`` reduced by ``mode``.

    token_mean: sum over valid tokens / global_tokens.
    seq_mean_token_mean: sum over sequences of their token mean / global_seqs.
    seq_mean_token_sum_norm (Dr.GRPO): sum over sequences of (token sum / max_len) / global_seqs.
    """
    if mode == "token_mean":
        return _masked(per_token, mask).sum() / global_tokens
    if mode == "seq_mean_token_mean":
        return _seq_mean(per_token, mask).sum() / global_seqs
    if mode == "seq_mean_token_sum_norm":
        return _masked(per_token, mask).sum() / max_len / global_seqs
    raise ValueError(f"unknown loss aggregation {mode!r}")


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token logprobs.

    k1 = logp - ref; k2 = 0.5 * (logp - ref)**2; k3 = exp(ref - logp) - (ref - logp) - 1.
    """
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown kl estimator {estimator!r}; use k1, k2 or k3")


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim, in float32 or wider.

    With z shifted by its max (no overflow, no cancellation): logsumexp(z) - sum(p * z);
    tokens of probability 0 (e.g. -inf logits) contribute 0.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    shifted = logits - logits.amax(dim=-1, keepdim=True).detach()
    probs = torch.softmax(shifted, dim=-1)
    weighted = torch.where(probs > 0, probs * shifted, torch.zeros_like(shifted))
    return torch.logsumexp(shifted, dim=-1) - weighted.sum(dim=-1)


def overlong_penalty(lengths: Tensor, max_new_tokens: int, buffer: int, factor: float) -> Tensor:
    """DAPO soft overlong punishment ``[N]`` (float64): 0 up to max - buffer, -factor at max."""
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float64, device=lengths.device)
    excess = lengths.to(torch.float64) - (max_new_tokens - buffer)
    return -factor * (excess / buffer).clamp(min=0.0, max=1.0)


def shape_rewards(
    rewards: Tensor, lengths: Tensor, cfg: AlgorithmConfig, max_new_tokens: int
) -> Tensor:
    """The one reward-shaping step on outcome rewards ``[N]``: adds the overlong penalty.

    KL-in-reward is token-wise, so it is not applied here: with ``cfg.kl_in_reward`` the
    trainer computes ``kl_penalty(prox_logp, ref_logp, cfg.kl_estimator)`` per token and
    passes it to ``advantages.compute_advantages(kl=...)``, which subtracts
    ``kl_coef * kl`` from the token rewards.
    """
    if cfg.overlong_buffer <= 0:
        return rewards
    penalty = overlong_penalty(lengths, max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty)
    return rewards + penalty.to(rewards.dtype)


def _behaviour_weight(
    prox_logp: Tensor, behav_logp: Tensor, mask: Tensor, cfg: AlgorithmConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """(capped weight, keep mask, raw weight) of pi_prox/mu, all detached.

    The keep mask drops tokens (or, at sequence level, whole sequences by their
    geometric-mean weight) whose raw weight leaves [behav_mask_low, behav_mask_high].
    """
    log_w = _masked((prox_logp - behav_logp).detach(), mask)
    raw = torch.exp(log_w)
    level_w = raw if cfg.behav_mask_level == "token" else torch.exp(_seq_mean(log_w, mask))
    keep = torch.ones_like(level_w, dtype=torch.bool)
    if cfg.behav_mask_low is not None:
        keep &= level_w >= cfg.behav_mask_low
    if cfg.behav_mask_high is not None:
        keep &= level_w <= cfg.behav_mask_high
    if cfg.behav_mask_level == "sequence":
        keep = keep[:, None].expand_as(raw)
    return raw.clamp(max=cfg.behav_weight_cap), keep, raw


def _ratio(logp: Tensor, prox_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """pi_theta/pi_prox per token, or GSPO's sequence ratio broadcast to tokens.

    At sequence level the value of every token is exp(mean_t(logp - prox)) and the
    gradient w.r.t. logp_t is that ratio (GSPO-token's stop-gradient trick).
    """
    log_ratio = _masked(logp - prox_logp, mask)
    if level == "sequence":
        seq = _seq_mean(log_ratio, mask).detach()[:, None]
        log_ratio = seq + _masked(logp - logp.detach(), mask)
    return torch.exp(log_ratio)


def _clipped_objective(
    ratio: Tensor, adv: Tensor, cfg: AlgorithmConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """(objective, clipped, dual-clipped): min(r A, clip(r) A), at least c A for A < 0."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high) * adv
    objective = torch.minimum(unclipped, clipped)
    was_clipped = clipped < unclipped
    dual = torch.zeros_like(was_clipped)
    if cfg.dual_clip is not None:
        bound = cfg.dual_clip * adv
        dual = (adv < 0) & (bound > objective)
        objective = torch.where(dual, bound, objective)
    return objective, was_clipped, dual


def _cispo_objective(
    ratio: Tensor, logp: Tensor, adv: Tensor, cfg: AlgorithmConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """(objective, clipped, no dual clip) of CISPO (MiniMax-M1): sg(clip(r)) * A * log pi_theta.

    The clipped importance weight is detached, so every token keeps a gradient: a token whose
    ratio left [1-eps_low, 1+eps_high] has its weight bounded instead of its gradient dropped.
    """
    is_weight = ratio.detach().clamp(1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high)
    clipped = is_weight != ratio.detach()
    return is_weight * adv * logp, clipped, torch.zeros_like(clipped)


def policy_loss(
    logp: Tensor,
    prox_logp: Tensor | None,
    behav_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: AlgorithmConfig,
    *,
    global_tokens: float,
    global_seqs: float,
    max_len: int,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The decoupled policy objective plus its KL and entropy terms, for one micro-batch.

    per token: -w * min(r A, clip(r, 1-eps_low, 1+eps_high) A) with r = pi_theta/pi_prox
    and w = min(pi_prox/mu, behav_weight_cap), detached; aggregated by ``cfg.loss_agg``.
    ``cfg.objective="cispo"``: -w * sg(clip(r, 1-eps_low, 1+eps_high)) * A * log pi_theta.
    ``prox_logp=None`` means pi_prox = mu (``recompute_proximal=False``). ``ref_logp`` is
    required when the KL is a loss term (kl_coef > 0 and not kl_in_reward); ``entropy``
    (``[N, L]``, e.g. from ``entropy_from_logits``) when entropy_coef != 0, and is logged
    whenever given. Stats are detached; ``STAT_REDUCTIONS`` says how to combine them.
    """
    behav_logp = behav_logp.detach()
    prox_logp = behav_logp if prox_logp is None else prox_logp.detach()
    weight, keep, raw_weight = _behaviour_weight(prox_logp, behav_logp, mask, cfg)
    ratio = _ratio(logp, prox_logp, mask, cfg.ratio_level)
    if cfg.objective == "cispo":
        objective, clipped, dual = _cispo_objective(ratio, logp, advantages.detach(), cfg)
    else:
        objective, clipped, dual = _clipped_objective(ratio, advantages.detach(), cfg)
    agg = {"global_tokens": global_tokens, "global_seqs": global_seqs, "max_len": max_len}
    # tokens dropped by the behaviour mask count as 0 but stay in every denominator
    loss = aggregate(_masked(-weight * objective, keep), mask, cfg.loss_agg, **agg)
    stats = {"pg_loss": loss.detach()}
    with torch.no_grad():
        log_r = _masked(logp - prox_logp, mask)
        stats["approx_kl"] = (0.5 * log_r**2).sum()
        stats["behav_weight_mean"] = _masked(weight, mask).sum()
        stats["behav_weight_max"] = _masked(raw_weight, mask).max()
        kept = mask & keep
        stats["clip_fraction"] = (clipped & kept).sum().to(logp.dtype)
        stats["dual_clip_fraction"] = (dual & kept).sum().to(logp.dtype)
        stats["masked_fraction"] = (mask & ~keep).sum().to(logp.dtype)
    if cfg.kl_coef > 0 and not cfg.kl_in_reward:
        if ref_logp is None:
            raise ValueError("algorithm.kl_coef > 0 with the KL as a loss term needs ref_logp")
        kl = kl_penalty(logp, ref_logp.detach(), cfg.kl_estimator)
        loss = loss + cfg.kl_coef * aggregate(kl, mask, cfg.loss_agg, **agg)
        stats["kl_ref"] = _masked(kl.detach(), mask).sum()
    if entropy is not None:
        if cfg.entropy_coef != 0:
            loss = loss - cfg.entropy_coef * aggregate(entropy, mask, cfg.loss_agg, **agg)
        stats["entropy"] = _masked(entropy.detach(), mask).sum()
    elif cfg.entropy_coef != 0:
        raise ValueError("algorithm.entropy_coef != 0 needs the per-token entropy")
    return loss, stats


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None,
    *,
    mode: str,
    global_tokens: float,
    global_seqs: float,
    max_len: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO value loss 0.5 * max((V - R)**2, (V_clipped - R)**2), aggregated by ``mode``.

    V_clipped = old + clamp(V - old, -clip, clip); ``clip=None`` gives 0.5 * (V - R)**2.
    Multiply by ``cfg.value_coef`` in the critic step.
    """
    returns = returns.detach()
    loss = (values - returns) ** 2
    clipped_frac = torch.zeros_like(mask)
    if clip is not None:
        old_values = old_values.detach()
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        clipped_loss = (v_clipped - returns) ** 2
        clipped_frac = (clipped_loss > loss) & mask
        loss = torch.maximum(loss, clipped_loss)
    agg = aggregate(
        0.5 * loss,
        mask,
        mode,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        max_len=max_len,
    )
    stats = {"value_loss": agg.detach(), "value_clip_fraction": clipped_frac.sum().to(values.dtype)}
    return agg, stats

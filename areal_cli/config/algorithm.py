"""The algorithm schema: one loss, one advantage function, one reward-shaping step.

Every RL algorithm areal offers (GRPO, Dr.GRPO, RLOO, REINFORCE++, PPO, DAPO, GSPO, ...)
is a set of values for these fields; the presets live in ``conf/algorithm/*.yaml``.
This module imports no torch so ``areal --help`` and config validation stay instant.
"""

from __future__ import annotations

from dataclasses import dataclass

ADV_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae")
RATIO_LEVELS = ("token", "sequence")
MASK_LEVELS = ("token", "sequence")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
OBJECTIVES = ("ppo_clip", "cispo")


@dataclass
class AlgorithmConfig:
    """Options of the decoupled PPO objective, the advantage estimator and reward shaping."""

    name: str = "grpo"
    """Preset name, for logs and the run directory; it selects nothing by itself."""

    # --- advantages ---
    adv_estimator: str = "grpo"
    """grpo | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline | gae (gae trains a critic)."""
    adv_norm_batch: bool = False
    """After the estimator, normalize advantages by their mean/std over the batch's tokens."""
    gamma: float = 1.0
    """Discount factor of GAE and of the KL-in-reward returns-to-go."""
    lam: float = 1.0
    """GAE lambda (used only by adv_estimator=gae)."""

    # --- policy objective ---
    objective: str = "ppo_clip"
    """ppo_clip = min(r A, clip(r) A); cispo = sg(clip(r)) A log pi_theta (MiniMax-M1's CISPO)."""
    eps_clip_low: float = 0.2
    """Lower clip: the ratio (cispo: its stop-gradient weight) is clipped at 1 - eps_clip_low; 1 =
    no lower bound."""
    eps_clip_high: float = 0.2
    """Upper clip: the ratio (cispo: its weight) is clipped at 1 + eps_clip_high (DAPO's clip-higher
    raises it)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 (ppo_clip only): for A < 0 the objective is at least c * A; None =
    off."""
    ratio_level: str = "token"
    """token = pi_theta/pi_prox per token; sequence = GSPO's length-normalized sequence ratio."""
    behav_weight_cap: float = 5.0
    """Cap on the behaviour weight pi_prox/mu that always multiplies the per-token objective."""
    behav_mask_low: float | None = None
    """Mask tokens/sequences whose uncapped pi_prox/mu is below this; None = no lower bound."""
    behav_mask_high: float | None = None
    """Mask tokens/sequences whose uncapped pi_prox/mu is above this; None = no upper bound."""
    behav_mask_level: str = "token"
    """token = mask single tokens; sequence = mask whole sequences by geometric-mean weight."""
    loss_agg: str = "token_mean"
    """token_mean | seq_mean_token_mean | seq_mean_token_sum_norm (Dr.GRPO: sum / max length)."""

    # --- regularizers and reward shaping ---
    kl_coef: float = 0.0
    """Weight of the KL to the reference policy; 0 = no reference model is loaded."""
    kl_estimator: str = "k3"
    """k1 = x, k2 = x**2 / 2, k3 = exp(-x) + x - 1 with x = log(pi / pi_ref)."""
    kl_in_reward: bool = False
    """True = subtract kl_coef * KL(mu || ref) from the token rewards; False = kl_coef * KL(pi ||
    ref) in the loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus subtracted from the loss; 0 = off (entropy is still logged)."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment: length of the penalty ramp before max_new_tokens; 0 = off."""
    overlong_penalty: float = 1.0
    """Reward penalty reached at max_new_tokens when overlong_buffer > 0."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: the controller drops groups whose rewards are all equal."""

    # --- mixture-of-experts models (no effect on dense ones) ---
    router_aux_loss_coef: float = 0.001
    """Weight of the routers' load-balancing loss (Switch's, as transformers computes it) added to
    the policy loss, per response token; 0 = off (router_aux_loss is still logged)."""
    routing_replay: bool = True
    """The engine returns the experts it chose for every token, and the trainer forces the same
    experts in every forward of those tokens, weighting them by its live router (docs/gpu.md
    "Mixture-of-experts models")."""
    routing_probe: bool = False
    """With routing_replay: each step also forwards its batch routed by the trainer's own routers
    (no gradient; a forward more per micro-batch) and logs ``logp_gap_fresh_free``, the behaviour
    vs trainer gap without replay on the same tokens as ``logp_gap_fresh``, and
    ``routing_flip_fraction``, the share of (token, sparse layer) whose experts the trainer's
    routers would choose otherwise than the engine did."""

    # --- critic (adv_estimator=gae) ---
    value_coef: float = 1.0
    """Weight of the value loss in the critic objective."""
    value_clip: float | None = 0.5
    """PPO value clipping: values move at most this far from the old values; None = unclipped."""
    critic_lr: float = 1e-5
    """Learning rate of the critic's optimizer."""

    # --- optimization schedule ---
    ppo_epochs: int = 1
    """Passes over each training batch; the proximal logprobs stay fixed across them."""
    recompute_proximal: bool = True
    """True: pi_prox = the trainer's weights before the step (AReaL's decoupled objective; with one
    optimizer step per batch the ratio pi_theta/pi_prox is 1 and the clip never acts, leaving only
    the capped weight pi_prox/mu). False: pi_prox = mu, the policy that sampled: the weight is 1 and
    the clip bounds pi_theta/mu, as plain PPO (docs/bench/history.md, "Staleness and held-out
    accuracy")."""

    @property
    def needs_critic(self) -> bool:
        """Whether a critic model is trained (only GAE uses values)."""
        return self.adv_estimator == "gae"

    @property
    def needs_reference(self) -> bool:
        """Whether a frozen reference model must be loaded for the KL term."""
        return self.kl_coef > 0

    def validate(self) -> list[str]:
        """Every problem with these values, each naming its key and the fix; empty if valid."""
        return [
            *self._check_choices(),
            *self._check_ranges(),
            *self._check_behaviour_mask(),
            *self._check_critic(),
        ]

    def _check_choices(self) -> list[str]:
        choices = {
            "adv_estimator": ADV_ESTIMATORS,
            "ratio_level": RATIO_LEVELS,
            "behav_mask_level": MASK_LEVELS,
            "loss_agg": LOSS_AGGS,
            "kl_estimator": KL_ESTIMATORS,
            "objective": OBJECTIVES,
        }
        return [
            f"algorithm.{key}={getattr(self, key)!r} is unknown; use one of {', '.join(allowed)}"
            for key, allowed in choices.items()
            if getattr(self, key) not in allowed
        ]

    def _check_ranges(self) -> list[str]:
        errors = []
        for key in ("gamma", "lam"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                errors.append(f"algorithm.{key}={getattr(self, key)} must lie in [0, 1]")
        if not 0.0 < self.eps_clip_low <= 1.0:
            errors.append(
                f"algorithm.eps_clip_low={self.eps_clip_low} must lie in (0, 1], e.g. 0.2"
            )
        if self.eps_clip_high <= 0.0:
            errors.append(f"algorithm.eps_clip_high={self.eps_clip_high} must be > 0, e.g. 0.2")
        if self.dual_clip is not None and self.objective == "cispo":
            errors.append("algorithm.dual_clip applies to objective=ppo_clip only; set it to null")
        elif self.dual_clip is not None and self.dual_clip <= 1.0:
            errors.append(
                f"algorithm.dual_clip={self.dual_clip} must be > 1 (e.g. 3.0), or null for off"
            )
        if self.behav_weight_cap < 1.0:
            errors.append(
                f"algorithm.behav_weight_cap={self.behav_weight_cap} must be >= 1 (default 5.0)"
            )
        for key in ("kl_coef", "entropy_coef", "overlong_buffer", "overlong_penalty",
                    "router_aux_loss_coef"):
            if getattr(self, key) < 0:
                errors.append(f"algorithm.{key}={getattr(self, key)} must be >= 0 (0 turns it off)")
        if self.ppo_epochs < 1:
            errors.append(f"algorithm.ppo_epochs={self.ppo_epochs} must be >= 1")
        return errors

    def _check_behaviour_mask(self) -> list[str]:
        errors = []
        low, high = self.behav_mask_low, self.behav_mask_high
        if low is not None and not 0.0 <= low <= 1.0:
            errors.append(
                f"algorithm.behav_mask_low={low} must lie in [0, 1] so on-policy tokens "
                "(weight 1) are kept; e.g. 0.5, or null for no lower bound"
            )
        if high is not None and high < 1.0:
            errors.append(
                f"algorithm.behav_mask_high={high} must be >= 1 so on-policy tokens "
                "(weight 1) are kept; e.g. 2.0, or null for no upper bound"
            )
        return errors

    def _check_critic(self) -> list[str]:
        if not self.needs_critic:
            return []
        errors = []
        if self.value_coef <= 0:
            errors.append(f"algorithm.value_coef={self.value_coef} must be > 0 with gae, e.g. 1.0")
        if self.value_clip is not None and self.value_clip <= 0:
            errors.append(
                f"algorithm.value_clip={self.value_clip} must be > 0 (e.g. 0.5) or null for no clip"
            )
        if self.critic_lr <= 0:
            errors.append(f"algorithm.critic_lr={self.critic_lr} must be > 0, e.g. 1e-5")
        return errors

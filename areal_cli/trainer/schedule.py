"""The learning-rate multiplier of each optimizer step (``trainer.warmup_steps``, ``lr_decay``,
``min_lr_ratio``): a linear warm-up to the full rate, then constant, or a linear or half-cosine
decay that reaches ``min_lr_ratio`` at the run's last step."""

from __future__ import annotations

import math

from areal_cli.config.choices import LrDecay


def lr_factor(step: int, steps: int, warmup: int = 0, decay: LrDecay = LrDecay.constant,
              min_ratio: float = 0.0) -> float:
    """The multiplier of lr for 0-based optimizer step ``step`` of a run of ``steps``."""
    warm = max(1, warmup)
    if step < warm - 1:
        return (step + 1) / warm
    if decay == LrDecay.constant:
        return 1.0
    top = warm - 1  # the first step at the full rate
    p = min(1.0, (step - top) / max(1, steps - 1 - top))
    if decay == LrDecay.linear:
        return 1.0 - (1.0 - min_ratio) * p
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))

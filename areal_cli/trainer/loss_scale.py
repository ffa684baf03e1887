"""Dynamic loss scaling for float16 compute (bfloat16 and float32 need none).

A float16 backward flushes gradients below ~6e-8 to zero, and the per-token gradients of a
loss averaged over thousands of tokens sit there. The loss is multiplied by ``value`` before
backward and the gradients divided by it after; a step whose gradient norm is not finite is
skipped and the scale halved, and after ``growth_interval`` good steps in a row it doubles.
The scale is not checkpointed: a resumed run starts again from ``init`` and finds its level
within a few steps.
"""

from __future__ import annotations

import torch


class LossScale:
    def __init__(self, enabled: bool, init: float = 2.0**16, growth_interval: int = 100):
        self.enabled = enabled
        self.value = init if enabled else 1.0
        self.growth_interval, self.good, self.skipped = growth_interval, 0, 0

    def unscale_(self, params) -> None:
        """Divide every gradient by the scale (in place)."""
        if not self.enabled:
            return
        inv = 1.0 / self.value
        for p in params:
            if p.grad is not None:
                p.grad.mul_(inv)

    def update(self, grad_norm: torch.Tensor) -> bool:
        """Whether the optimizer may step: not when float16 gradients overflowed (the scale
        halves); without scaling, always."""
        if not self.enabled:
            return True
        if not bool(torch.isfinite(grad_norm)):
            self.value, self.good, self.skipped = self.value / 2, 0, self.skipped + 1
            return False
        self.good += 1
        if self.good % self.growth_interval == 0:
            self.value *= 2
        return True

    def stats(self) -> dict:
        """The scale (float16 only); skipped steps are counted by the step, in every dtype."""
        return {"loss_scale": self.value} if self.enabled else {}

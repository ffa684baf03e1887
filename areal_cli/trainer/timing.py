"""Where a training step's time goes: consecutive marks that tile the step, each part the time since
the previous mark.

On CUDA each mark records an event on the current stream (no host synchronisation): a part is the
GPU time between two events, so a host-side part (building a micro-batch's inputs) counts the time
the GPU waited for it, and the parts add up to the GPU's span of the step. The events are resolved
once, at the end of the step (``parts``), when the step synchronises anyway. On the CPU a mark is
``time.perf_counter()``.

The parts of ``StepRunner.train`` (``time/<part>_s`` in metrics.jsonl, with ``time/step_s``):

| part | what |
|---|---|
| prepare | the batch into rows, micro-batches, advantages, each micro-batch's inputs (packing) |
| reference, critic_values, proximal | the frozen reference's, the critic's and π_prox's no-grad
passes |
| forward | the decoder layers' forward (and their FSDP all-gathers' waits) |
| head_forward | the output layer, log-softmax, logprob and entropy of the response positions |
| loss | the policy loss and its stats |
| head_backward | the output layer's backward, its chunks' recomputation included |
| backward | the decoder layers' backward, recomputed activations and reduce-scatters included |
| optimizer | gradient clipping and the optimizer step |
| critic_train | the critic's value-loss passes and its step |
| stats | the step's stats reduced over ranks |

The weight broadcast's gather after the step is ``weight_gather_s`` (``trainer/main.py``).
"""

from __future__ import annotations

import time

import torch


class StepClock:
    """Marks of one step. ``start()``, then ``mark(part)`` at the end of each part, then
    ``parts()``."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, object]] = []
        self._t0 = 0.0

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        """Begin a step (drops the marks of the last one)."""
        self._t0 = time.perf_counter()
        self._marks = [("", self._now())]

    def mark(self, part: str) -> None:
        """The time since the previous mark belongs to ``part`` (parts may repeat: they add up)."""
        if self._marks:
            self._marks.append((part, self._now()))

    def parts(self) -> dict[str, float]:
        """``time/<part>_s`` for every part, and ``time/step_s``: the host's time from ``start`` to
        the end of the last part (waiting for the GPU to reach it)."""
        if not self._marks:
            return {}
        if self.cuda:
            self._marks[-1][1].synchronize()
        out: dict[str, float] = {}
        for (_, a), (part, b) in zip(self._marks, self._marks[1:], strict=False):
            seconds = a.elapsed_time(b) / 1e3 if self.cuda else b - a
            out[f"time/{part}_s"] = out.get(f"time/{part}_s", 0.0) + seconds
        out["time/step_s"] = time.perf_counter() - self._t0
        self._marks = []
        return out

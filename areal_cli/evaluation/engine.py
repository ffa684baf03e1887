"""The training engine (HFEngine) with a greedy mode, on a model loaded once per evaluation.

Temperature 0 means argmax (``greedy``; a tiny temperature is not greedy); otherwise it
samples exactly as a rollout worker does. Everything after construction (submit,
poll, close) is HFEngine's. It takes an already loaded model so the greedy and the sampled
pass of one model share its weights; stopping a manager without keeping it leaves nothing
cached on the model, so the next pass builds its own.
"""

from __future__ import annotations

from areal_cli.rollout.engines.hf import HFEngine


class EvalEngine(HFEngine):
    def __init__(self, model, *, temperature: float, **engine):
        self._start(model, temperature=temperature, greedy=temperature <= 0, **engine)

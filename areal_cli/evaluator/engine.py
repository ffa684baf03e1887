"""The training engines with a greedy mode: HFEngine on a model loaded once per evaluation, and
VLLMEngine with its sampling chosen per pass.

Temperature 0 means argmax (``greedy``; a tiny temperature is not greedy); otherwise it
samples exactly as a rollout worker does. Everything after construction (submit,
poll, close) is the training engine's.

hf: ``EvalEngine`` takes an already loaded model so the greedy and the sampled pass of one
model share its weights; stopping a manager without keeping it leaves nothing cached on the
model, so the next pass builds its own.

vllm: ``VLLMEvalEngine`` is built once per model (building a ``vllm.LLM`` takes seconds to
minutes) and ``sampling(temperature, top_p)`` switches it between passes. vLLM decodes greedily
(argmax) at temperature 0, ignoring top_p/top_k.
"""

from __future__ import annotations

from areal_cli.config.schema import EngineConfig, RootConfig
from areal_cli.rollout.engines.hf import HFEngine
from areal_cli.rollout.engines.vllm import VLLMEngine


class EvalEngine(HFEngine):
    def __init__(self, model, *, temperature: float, **engine):
        self._start(model, temperature=temperature, greedy=temperature <= 0, **engine)


class VLLMEvalEngine(VLLMEngine):
    """A rollout worker's vLLM engine (``engine.*`` of the eval config, sampling seed ``seed``)."""

    def __init__(self, model_path, engine_cfg: EngineConfig, seed: int = 0):
        super().__init__(model_path, RootConfig(seed=seed, engine=engine_cfg), 0)
        self.sampling(0.0, 1.0)

    def sampling(self, temperature: float, top_p: float) -> None:
        """Sampling params of the next requests: greedy at ``temperature <= 0``, else as a rollout
        worker samples (the same SamplingParams as ``VLLMEngine``, other temperature and top_p)."""
        self._sampling(*((0.0, 1.0) if temperature <= 0 else (temperature, top_p)))

"""The training engine (HFEngine) with a greedy mode, on a model loaded once per evaluation.

HFEngine always samples (its GenerationConfig has ``do_sample=True``): right for rollouts,
wrong for greedy accuracy. A tiny temperature is not greedy, so this subclass builds the same
continuous-batching manager with ``do_sample=False`` (argmax) when temperature is 0, and
otherwise samples exactly as a rollout worker does. Everything after construction (submit,
poll, close) is HFEngine's. It takes an already loaded model so the greedy and the sampled
pass of one model share its weights; stopping a manager without keeping it leaves nothing
cached on the model, so the next pass builds its own.
"""

from __future__ import annotations

import math

from areal_cli.rollout.engines.hf import HFEngine


class EvalEngine(HFEngine):
    def __init__(self, model, *, temperature: float, top_p: float, max_batch_tokens: int,
                 kv_cache_tokens: int, page_size: int, eos_token_id):
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        self.device, self._model = model.device, model
        if temperature > 0:
            sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        else:
            sampling = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        gen = GenerationConfig(**sampling, eos_token_id=eos_token_id, pad_token_id=eos_token_id,
                               max_new_tokens=1 << 20)
        cb = ContinuousBatchingConfig(
            num_blocks=max(16, math.ceil(kv_cache_tokens / page_size)), page_size=page_size,
            max_batch_tokens=max_batch_tokens, return_logprobs=True, allow_block_sharing=False)
        self.eos = set([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
        self.manager = model.init_continuous_batching(generation_config=gen,
                                                      continuous_batching_config=cb)
        self.manager.start()
        self.seqs, self.segment = {}, {}
        self.version = 0
        self._finished_during_pause = []

"""reward.judge.engine=vllm: the generative judge as a ``vllm.LLM`` in the reward-model process, on
the GPU of reward.gpus (the launcher makes it the only visible one).

Prompts are the token ids ``JudgeBase`` builds for the hf judge (the chat template, the last
reward.judge.max_tokens tokens), so both engines read the same input, and one ``generate`` scores
a batch. verdict=yes_no samples one token with the top ``TOP_LOGPROBS`` logprobs: P(yes) and P(no)
sum the yes/no tokens among them (a token outside the top counts 0, so a judge that meant neither
fails ``min_verdict_mass``); verdict=number decodes a greedy reply. The model is frozen: vLLM
loads it once and nothing updates it.
"""

from __future__ import annotations

import math

from areal_cli.config.reward_models import JudgeConfig
from areal_cli.engines import spec
from areal_cli.rewards.judge import JudgeBase

TOP_LOGPROBS = 20
"""Logprobs vLLM returns for the first reply token (its default max_logprobs)."""
LEN_MARGIN = 8
"""Positions beyond the prompt and the reply in max_model_len."""


def import_vllm():
    """vLLM, or a ValueError naming the extra to install."""
    spec("vllm").require("reward.judge.engine")
    import vllm

    return vllm


class VLLMJudge(JudgeBase):
    """The loaded judge: one vllm.LLM taking ``gpu_memory_utilization`` of the visible GPU."""

    def __init__(self, model_dir, cfg: JudgeConfig, dtype):
        vllm = import_vllm()
        super().__init__(model_dir, cfg)
        self.llm = vllm.LLM(model=str(model_dir), dtype=dtype,
                            gpu_memory_utilization=cfg.gpu_memory_utilization,
                            max_model_len=cfg.max_tokens + cfg.max_new_tokens + LEN_MARGIN,
                            enable_prefix_caching=True, seed=0)
        self.first_token = vllm.SamplingParams(max_tokens=1, temperature=1.0, logprobs=TOP_LOGPROBS,
                                               detokenize=False)
        self.greedy = vllm.SamplingParams(max_tokens=cfg.max_new_tokens, temperature=0.0)

    def _generate(self, items, params) -> list:
        prompts = [{"prompt_token_ids": ids} for ids in self.encode(items)["input_ids"]]
        return [out.outputs[0] for out in self.llm.generate(prompts, params, use_tqdm=False)]

    def _yes_no_mass(self, items) -> tuple[list[float], list[float]]:
        top = [reply.logprobs[0] for reply in self._generate(items, self.first_token)]
        return [mass(t, self.yes) for t in top], [mass(t, self.no) for t in top]

    def _replies(self, items) -> list[list[int]]:
        return [list(reply.token_ids) for reply in self._generate(items, self.greedy)]


def mass(top: dict, ids: list[int]) -> float:
    """The probability of ``ids`` among ``top`` (token id → vLLM ``Logprob``); an absent id counts
    0."""
    return sum(math.exp(top[i].logprob) for i in ids if i in top)

"""Typed schema of the rewards that need a model: a sequence-classification reward model and a
generative judge, served by the run's reward-model process (``areal_cli/rewards/server.py``);
and the parts of a combined ``reward.fn``. No torch, no heavy imports."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

MODEL_PARTS = ("model", "judge")
"""reward.fn values scored by the reward-model process; every other value is a verifier."""
VERDICTS = ("yes_no", "number")
PARSE_ERROR_SCORES = ("min", "error")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
PLACEHOLDERS = ("problem", "reference", "completion")


class JudgeEngine(StrEnum):
    """What runs the judge; auto = vllm on reward.gpus where the run's engine is vllm, else hf. The
    names are the generation engines' (engine=hf | vllm)."""

    auto = "auto"
    hf = "hf"
    vllm = "vllm"


DEFAULT_JUDGE_TEMPLATE = (
    "Here is a question and an answer to it.\n\nQuestion: {problem}\n\nAnswer: {completion}\n\n"
    "Is the answer one short sentence that answers the question? Reply with yes or no."
)


@dataclass
class RewardModelConfig:
    """reward.fn=model: an AutoModelForSequenceClassification scoring (problem, completion)."""

    path: str = ""
    """The reward model: a local Hugging Face directory, a Hub id (Org/Name) or an alias."""
    label: str = ""
    """Which output of the head is the reward: a name of its id2label or an index; "" = the only
    one (a head with several labels needs it)."""
    max_tokens: int = 1024
    """Tokens of (problem, completion) the model reads; longer inputs keep their last tokens."""


@dataclass
class JudgeConfig:
    """reward.fn=judge: a frozen generative model grades each completion from a rubric template."""

    model: str = ""
    """The judge: an alias, local directory or Hub id; "" = the run's initial policy model
    (frozen)."""
    template: str = DEFAULT_JUDGE_TEMPLATE
    """The judge's user message; {problem}, {reference} and {completion} are replaced by the
    problem text, its reference answer and the completion ({completion} is required). Text is
    substituted, never evaluated; other braces stay as written."""
    verdict: str = "yes_no"
    """yes_no = the score is P(yes) / (P(yes) + P(no)) of the judge's first token; number = the
    judge writes a number in [score_min, score_max], scaled to [0, 1]."""
    score_min: float = 0.0
    """verdict=number: the lowest grade the template asks for (scores 0)."""
    score_max: float = 10.0
    """verdict=number: the highest grade the template asks for (scores 1)."""
    max_new_tokens: int = 8
    """verdict=number: tokens the judge may write (greedy); the first number in them is the
    grade."""
    min_verdict_mass: float = 0.05
    """verdict=yes_no: P(yes) + P(no) below this is a parse failure (the judge meant neither)."""
    on_parse_error: str = "min"
    """A verdict that cannot be parsed (counted toward reward.max_error_fraction either way): min =
    scores 0, the bottom of the range, with status parse_error (reward_judge_parse_error); error =
    fails like a crashed call (status "error", reward_judge_error and reward_errors)."""
    max_tokens: int = 1024
    """Tokens of the rendered template the judge reads; longer prompts keep their last tokens."""
    engine: JudgeEngine = JudgeEngine.auto
    """hf = a transformers model in the reward-model process (the CPU or reward.gpus); vllm = a
    vllm.LLM on the GPU of reward.gpus (the vllm extra); auto = vllm where reward.gpus is set and
    the run's engine is vllm, else hf (resolved when the run is planned)."""
    gpu_memory_utilization: float = 0.8
    """engine=vllm: the share of the judge GPU's memory vLLM takes (its weights and KV cache)."""


def reward_parts(fn) -> list[str]:
    """reward.fn as a list of its parts: "auto" → ["auto"], ["auto", "judge"] as given."""
    if isinstance(fn, list | tuple):
        return [str(x) for x in fn]
    return [str(fn)]


def part_name(fn: str) -> str:
    """The name a part's metrics carry: model, judge, or verifier for every other fn."""
    return fn if fn in MODEL_PARTS else "verifier"


def template_problems(template: str) -> list[str]:
    """What is wrong with a judge template: {completion} missing, an unknown {name}."""
    names = PLACEHOLDER.findall(template)
    errors = []
    if "completion" not in names:
        errors.append("reward.judge.template has no {completion}: the judge would never see the "
                      "answer; add {completion} where the answer goes")
    unknown = sorted(set(names) - set(PLACEHOLDERS))
    if unknown:
        errors.append(f"reward.judge.template names {', '.join('{' + n + '}' for n in unknown)}: "
                      "only {problem}, {reference} and {completion} are filled in; fix the "
                      "spelling")
    return errors


def judge_problems(j: JudgeConfig, gpus: list) -> list[str]:
    """What is wrong with reward.judge for a reward-model process on ``gpus`` (reward.gpus)."""
    errors = template_problems(j.template)
    if j.engine == JudgeEngine.vllm and not gpus:
        errors.append("reward.judge.engine=vllm needs a GPU and reward.gpus is empty: set "
                      "reward.gpus=[<gpu id>] (a GPU of its own), or reward.judge.engine=hf")
    if j.verdict not in VERDICTS:
        errors.append(f"reward.judge.verdict={j.verdict!r}: use one of {', '.join(VERDICTS)}")
    if j.on_parse_error not in PARSE_ERROR_SCORES:
        errors.append(f"reward.judge.on_parse_error={j.on_parse_error!r}: use one of "
                      f"{', '.join(PARSE_ERROR_SCORES)}")
    if j.verdict == "number" and not j.score_min < j.score_max:
        errors.append(f"reward.judge.score_min={j.score_min} must be below score_max={j.score_max}")
    return errors

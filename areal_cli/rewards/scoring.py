"""score(): one completion against one problem, by the scorer RewardConfig.fn names."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from areal_cli.config.task import RewardConfig
from areal_cli.rewards.code_reward import code_score
from areal_cli.rewards.extract import extract_answer
from areal_cli.rewards.math_reward import exact_score, math_verify_score, numeric_score, same_answer
from areal_cli.tasks.base import Problem
from areal_cli.user_code import load_callable

Scorer = Callable[[str, Problem], float]


def score(completion: str, problem: Problem, cfg: RewardConfig) -> float:
    """The reward of one completion, in this process (may be slow; run it in a RewardPool)."""
    return float(resolve(cfg.fn, problem)(completion, problem, cfg))


def resolve(fn: str, problem: Problem) -> Callable[[str, Problem, RewardConfig], float]:
    """The scorer for a reward.fn value; "auto" picks by what the problem carries."""
    if fn == "auto":
        fn = auto_fn(problem)
    builtin = {
        "reasoning_gym": lambda c, p, cfg: reasoning_gym_score(c, p, cfg.partial_credit),
        "math_verify": lambda c, p, cfg: math_verify_score(c, p.answer),
        "exact": lambda c, p, cfg: exact_score(c, p.answer),
        "numeric": lambda c, p, cfg: numeric_score(c, p.answer, cfg.numeric_tol),
        "code": code_score,
    }
    if fn in builtin:
        return builtin[fn]
    custom = import_custom(fn)
    return lambda c, p, cfg: custom(c, p)


def auto_fn(problem: Problem) -> str:
    """reasoning-gym entries use their dataset's verifier, problems with tests the sandbox,
    everything else math-verify."""
    if "rg_dataset" in problem.meta:
        return "reasoning_gym"
    if "test" in problem.meta:
        return "code"
    return "math_verify"


def reasoning_gym_score(completion: str, problem: Problem, partial_credit: bool = False) -> float:
    """1.0 only for a correct answer: equal to the reference after normalisation, the same
    number, or given full credit by the dataset's own score_answer; else 0.0.

    The extracted answer is the line after the last "Answer:" (every line after it when the
    reference has several), else the last number. ``partial_credit``: the dataset's graded
    score instead of 0 (its default pays len(reference)/len(answer) when the reference occurs
    inside the answer: "10" for "0" earns 0.5, a gameable reward).
    """
    meta = problem.meta
    if "rg_dataset" not in meta or "rg_entry" not in meta:
        raise ValueError(
            f"reward.fn=reasoning_gym but problem {problem.id!r} is not from reasoning-gym "
            "(no meta['rg_dataset']); use reward.fn=auto or math_verify"
        )
    answer = extract_answer(completion, multiline="\n" in problem.answer.strip())
    if answer is None:
        return 0.0
    if same_answer(answer, problem.answer):
        return 1.0
    graded = min(1.0, float(_rg_scorer(meta["rg_dataset"])(answer, meta["rg_entry"]) or 0.0))
    return graded if partial_credit or graded >= 1.0 else 0.0


@lru_cache(maxsize=64)
def _rg_scorer(dataset: str):
    from reasoning_gym.factory import get_score_answer_fn

    return get_score_answer_fn(dataset)


def import_custom(path: str) -> Scorer:
    """`module:function` -> the user's scorer; ValueError naming what is missing and the fix."""
    return load_callable(path, "reward.fn", "(completion: str, problem: Problem) -> float")

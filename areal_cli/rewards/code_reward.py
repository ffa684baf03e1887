"""Code reward: the completion's program, then the problem's unit tests, in the sandbox."""

from __future__ import annotations

import re

from areal_cli.config.task import RewardConfig
from areal_cli.rewards.extract import extract_code
from areal_cli.rewards.sandbox import Limits, SandboxResult, run_python
from areal_cli.tasks.base import Problem


def limits_of(cfg: RewardConfig) -> Limits:
    return Limits(
        cpu_s=cfg.code_cpu_s, wall_s=cfg.code_wall_s, mem_mb=cfg.code_mem_mb, nproc=cfg.code_nproc
    )


def build_program(completion: str, meta: dict) -> str:
    """code_prefix (e.g. HumanEval's signature + docstring), the code, the tests, the check.

    A completion with a ```python block, or one that defines the entry point itself, is a
    whole program placed after the prefix (its definition wins); otherwise it is the body
    that continues the prefix, as in HumanEval's original completion format.
    """
    if "test" not in meta:
        raise ValueError(
            "code reward needs unit tests in problem.meta['test'] "
            f"(meta has: {sorted(meta)}); add a 'test' field to the dataset"
        )
    prefix, entry = meta.get("code_prefix", ""), meta.get("entry_point", "")
    code = extract_code(completion)
    whole = "```" in completion or (entry and re.search(rf"def\s+{re.escape(entry)}\b", code))
    body = f"{prefix}\n{code}" if whole else f"{prefix}{code}"
    check = f"\ncheck({entry})\n" if entry else "\n"
    return f"{body}\n\n{meta['test']}\n{check}"


def run_tests(completion: str, problem: Problem, cfg: RewardConfig) -> SandboxResult:
    return run_python(build_program(completion, problem.meta), limits_of(cfg))


def code_score(completion: str, problem: Problem, cfg: RewardConfig) -> float:
    """1.0 when the program runs to its end with every test passing, else 0.0."""
    return 1.0 if run_tests(completion, problem, cfg).passed else 0.0

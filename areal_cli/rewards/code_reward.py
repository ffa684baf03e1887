"""Code reward: the completion's program, then the problem's unit tests, in the sandbox."""

from __future__ import annotations

import re

from areal_cli.config.task import RewardConfig
from areal_cli.rewards.extract import extract_code
from areal_cli.rewards.sandbox import Limits, SandboxResult
from areal_cli.rewards.sandbox import run_tests as sandbox_tests
from areal_cli.tasks.base import Problem

last_isolation = {"isolation": ""}
"""Which isolation the last code_score call in this process ran (the reward pool reports it)."""


def limits_of(cfg: RewardConfig) -> Limits:
    return Limits(
        cpu_s=cfg.code_cpu_s, wall_s=cfg.code_wall_s, mem_mb=cfg.code_mem_mb, nproc=cfg.code_nproc
    )


def build_program(completion: str, meta: dict) -> str:
    """code_prefix (e.g. HumanEval's signature + docstring), then the completion's code.

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
    return f"{prefix}\n{code}" if whole else f"{prefix}{code}"


def run_tests(completion: str, problem: Problem, cfg: RewardConfig) -> SandboxResult:
    """The program, then meta['test'] (and check(entry_point) when there is one)."""
    meta = problem.meta
    program = build_program(completion, meta)
    result = sandbox_tests(
        program, meta["test"], meta.get("entry_point", ""), meta.get("code_prefix", ""),
        limits_of(cfg), cfg.sandbox,
    )  # fmt: skip
    last_isolation["isolation"] = result.isolation
    return result


def code_score(completion: str, problem: Problem, cfg: RewardConfig) -> float:
    """1.0 when every test passes on the candidate's answers (decided outside it), else 0.0."""
    return 1.0 if run_tests(completion, problem, cfg).passed else 0.0

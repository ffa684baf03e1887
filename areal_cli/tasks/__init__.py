"""Task sources: every one turns a TaskConfig and a split into a list of Problems."""

from __future__ import annotations

from areal_cli.config.task import TaskConfig
from areal_cli.tasks.base import Problem, check_split

__all__ = ["Problem", "build_messages", "load_problems"]


def load_problems(cfg: TaskConfig, split: str) -> list[Problem]:
    """The problems of one split ("train" | "eval"); the two are disjoint, chosen by seed."""
    check_split(split)
    if cfg.source == "reasoning_gym":
        from areal_cli.tasks import reasoning_gym_task as source
    elif cfg.source == "file":
        from areal_cli.tasks import files as source
    elif cfg.source == "hf_disk":
        from areal_cli.tasks import hf_disk as source
    elif cfg.source == "humaneval":
        from areal_cli.tasks import humaneval as source
    else:
        raise ValueError(
            f"task.source={cfg.source!r}: use reasoning_gym, file, hf_disk or humaneval"
        )
    return source.load(cfg, split)


def build_messages(problem: Problem, cfg: TaskConfig) -> list[dict]:
    """Chat messages for one problem: the optional system prompt, then the user prompt."""
    messages = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    return messages + [{"role": "user", "content": problem.prompt}]

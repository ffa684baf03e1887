"""Task sources: every one turns a TaskConfig and a split into a list of Problems.

The train and eval splits are disjoint by content (tasks/splits.py); ``load_split`` also says
how each was made, ``split_report`` both sides at once (what a run writes to splits.json).
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_cli.config.task import TaskConfig
from areal_cli.tasks.base import Problem, check_split
from areal_cli.tasks.splits import SplitReport, overlap, space
from areal_cli.tasks.tokens import build_messages, load_tokenizer, prompt_ids, prompt_text

__all__ = ["Problem", "Split", "build_messages", "load_problems", "load_split", "load_tokenizer",
           "prompt_ids",
           "prompt_text", "split_report"]


@dataclass
class Split:
    """The problems of one split and how they were chosen."""

    problems: list[Problem]
    report: SplitReport


def load_split(cfg: TaskConfig, split: str) -> Split:
    """One split ("train" | "eval"): disjoint from the other by content, with its report."""
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
    problems, report = source.load(cfg, split)
    return Split(problems, report)


def load_problems(cfg: TaskConfig, split: str) -> list[Problem]:
    """The problems of one split ("train" | "eval"); the two never share a content key."""
    return load_split(cfg, split).problems


def split_report(cfg: TaskConfig, train: Split, held: Split) -> dict:
    """Both splits' figures, the space they sampled, and their overlap (0 by construction)."""
    return {
        "task": cfg.name, "source": cfg.source,
        "dataset": cfg.dataset if cfg.source == "reasoning_gym" else "",
        "eval_share": cfg.eval_share if cfg.source == "reasoning_gym" else None,
        "train": train.report.to_dict(), "eval": held.report.to_dict(),
        "space": space([train.report, held.report]),
        "overlap": overlap(held.problems, train.problems),
    }

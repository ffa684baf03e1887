"""`areal eval`: every model × every task, one table; eval.json and eval.md in out_dir.

Everything a user can get wrong (config, model path, task) is checked before any model
loads, and reported on stderr with exit code 2, without a traceback.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from areal_cli.config.load import ConfigError
from areal_cli.evaluation.config import EvalRunConfig, compose_eval, resolve_eval_model
from areal_cli.models import ModelError


class EvalError(Exception):
    """Something the user must fix; the message says what."""


def run_eval(overrides: list[str]) -> None:
    """The `areal eval` command (exit 2 on a user error)."""
    try:
        _run(overrides)
    except EvalError as err:
        print(f"areal eval: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def _run(overrides: list[str]) -> None:
    t0 = time.perf_counter()
    cfgs = _configs(overrides)
    head = cfgs[0]
    models = _models(head)
    problems = [_problems(cfg) for cfg in cfgs]
    out_dir = Path(head.out_dir or time.strftime("runs/eval-%Y%m%d-%H%M%S"))
    results = []
    for name, path in models:
        results += _evaluate_model(name, path, cfgs, problems)
    from areal_cli.evaluation import report

    run = _run_info(head, cfgs, models, time.perf_counter() - t0)
    report.write(results, out_dir, run)
    report.print_table(results)
    _say(f"wrote {out_dir / 'eval.json'} and {out_dir / 'eval.md'} ({run['wall_s']:.0f} s)")


def _configs(overrides: list[str]) -> list[EvalRunConfig]:
    try:
        return compose_eval(overrides)
    except ConfigError as err:
        raise EvalError(f"invalid config:\n{err}") from None


def _models(cfg: EvalRunConfig) -> list[tuple[str, Path]]:
    """(name as given, local directory) of every model, all checked before any loads."""
    out, problems = [], []
    for name in cfg.model_list():
        try:
            out.append((name, resolve_eval_model(name)))
        except ModelError as err:
            problems.append(str(err))
    if problems:
        raise EvalError("\n".join(problems))
    return out


def _problems(cfg: EvalRunConfig):
    from areal_cli.evaluation.runner import eval_problems

    try:
        problems = eval_problems(cfg.task, cfg.size)
    except ValueError as err:
        raise EvalError(f"task {cfg.task.name}: {err}") from None
    if not problems:
        raise EvalError(f"task {cfg.task.name}: its eval split is empty; set task.eval_size > 0")
    return problems


def _evaluate_model(name: str, path: Path, cfgs: list[EvalRunConfig], problems: list) -> list[dict]:
    from transformers.utils import logging as hf_logging

    from areal_cli.evaluation.runner import Evaluator

    hf_logging.disable_progress_bar()
    head, results = cfgs[0], []
    _say(f"loading {name} ({path})")
    try:
        evaluator = Evaluator(path, head.reward, head.engine, head.threads or os.cpu_count(), head.max_concurrent)
    except (OSError, ValueError) as err:
        raise EvalError(f"model={name}: cannot load {path}: {err}") from None
    with evaluator:
        for cfg, task_problems in zip(cfgs, problems, strict=True):
            _say(f"{name} on {cfg.task.name}: {len(task_problems)} problems, {_passes(cfg)}")
            result = evaluator.run(cfg.task, n_samples=cfg.n_samples, temperature=cfg.temperature,
                                   max_new_tokens=cfg.max_new_tokens, greedy=cfg.greedy, top_p=cfg.top_p,
                                   seed=cfg.seed, problems=task_problems)
            result.update(model=name, model_path=str(path))
            results.append(result)
            _say(f"  done in {result['wall_s']:.0f} s")
    return results


def _passes(cfg: EvalRunConfig) -> str:
    sampled = f"{cfg.n_samples} samples at temperature {cfg.temperature}" if cfg.temperature > 0 else ""
    greedy = "greedy" if cfg.greedy or cfg.temperature == 0 else ""
    return " + ".join(p for p in (greedy, sampled) if p)


def _run_info(head: EvalRunConfig, cfgs: list[EvalRunConfig], models, wall_s: float) -> dict:
    keys = ("n_samples", "temperature", "top_p", "greedy", "max_new_tokens", "size", "seed")
    info = {k: getattr(head, k) for k in keys}
    info.update(models={name: str(path) for name, path in models}, wall_s=round(wall_s, 2),
                tasks={cfg.task.name: asdict(cfg.task) for cfg in cfgs}, reward=asdict(head.reward))
    return info


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

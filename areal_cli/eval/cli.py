"""`areal eval`: every model × every task, one table; eval.json and eval.md in out_dir.

Everything a user can get wrong (config, model path, task, vLLM missing, a GPU id not visible)
is checked before any model loads, and reported on stderr with exit code 2, without a
traceback. With ``gpus=[...]`` or ``workers>1`` the problems are evaluated data-parallel in
worker processes (eval/parallel.py); a worker that fails is exit code 1, naming its shard.
"""

from __future__ import annotations

import secrets
import sys
import time
from dataclasses import asdict
from pathlib import Path

from areal_cli.eval.config import EvalRunConfig, compose_eval
from areal_cli.eval.sweep import EvalError, evaluate_model, say
from areal_cli.model_source import ModelError, resolve_eval_model
from areal_cli.runconfig.compose import ConfigError
from areal_cli.rundir import RunDir
from areal_cli.runtime import usable_cores


def run_eval(overrides: list[str]) -> None:
    """The `areal eval` command (exit 2 on a user error, 1 when a data-parallel worker fails)."""
    from areal_cli.eval.parallel import WorkerFailed
    from areal_cli.eval.runner import EvalStalled

    try:
        _run(overrides)
    except EvalError as err:
        print(f"areal eval: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except (WorkerFailed, EvalStalled) as err:
        print(f"areal eval: {err}", file=sys.stderr)
        raise SystemExit(1) from None


def _run(overrides: list[str]) -> None:
    t0 = time.perf_counter()
    cfgs = _configs(overrides)
    head = cfgs[0]
    _check_engine(head)
    _check_gpus(head)
    models = _models(head)
    chosen = [_problems(cfg, models) for cfg in cfgs]
    problems = [p for p, _ in chosen]
    out_dir = Path(head.out_dir or time.strftime("runs/eval-%Y%m%d-%H%M%S")
                   + f"-{secrets.token_hex(2)}")
    if head.data_parallel():
        from areal_cli.eval.parallel import run_data_parallel

        results = run_data_parallel(overrides, cfgs, models, problems, out_dir, say=say)
    else:
        results = []
        for name, path in models:
            results += evaluate_model(name, path, cfgs, problems, head.threads or usable_cores())
    from areal_cli.eval import report

    run = _run_info(head, cfgs, models, time.perf_counter() - t0)
    run["splits"] = {cfg.task.name: info for cfg, (_, info) in zip(cfgs, chosen, strict=True)}
    report.write(results, out_dir, run)
    report.print_table(results)
    say(f"wrote {out_dir / 'eval.json'} and {out_dir / 'eval.md'} ({run['wall_s']:.0f} s)")


def _configs(overrides: list[str]) -> list[EvalRunConfig]:
    try:
        return compose_eval(overrides)
    except ConfigError as err:
        raise EvalError(f"invalid config:\n{err}") from None


def _check_engine(cfg: EvalRunConfig) -> None:
    """What the engine imports (vLLM for engine=vllm), here, before any model loads (the message
    names the extra)."""
    from areal_cli.engines import spec

    try:
        spec(cfg.engine.name).require()
    except ValueError as err:
        raise EvalError(str(err)) from None


def _check_gpus(cfg: EvalRunConfig) -> None:
    """Every id of ``gpus`` must be a visible GPU (else the worker would silently run on the
    CPU)."""
    if not cfg.gpus:
        return
    import torch

    visible = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    missing = [int(g) for g in cfg.gpus if int(g) not in visible]
    if missing:
        seen = f"visible: {visible}" if visible else "no GPU is visible"
        raise EvalError(f"gpus={list(cfg.gpus)}: GPU {missing} not visible ({seen}); "
                        "on the CPU use workers=N for N processes")


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


def _problems(cfg: EvalRunConfig, models: list[tuple[str, Path]]) -> tuple[list, dict]:
    """The task's eval problems, less any found in the training split of a run_dir being
    evaluated, then the first ``size``; with what eval.json reports about how they were chosen."""
    from areal_cli.tasks import load_split

    try:
        split = load_split(cfg.task, "eval")
    except ValueError as err:
        raise EvalError(f"task {cfg.task.name}: {err}") from None
    problems, dropped = split.problems, {}
    for name, _ in models:
        trained = _trained_keys(name)
        if trained is not None:
            dropped[name] = sum(p.key in trained for p in split.problems)
            problems = [p for p in problems if p.key not in trained]
    problems = problems[: cfg.size or None]
    if not problems:
        raise EvalError(f"task {cfg.task.name}: no eval problem is left (eval split "
                        f"{len(split.problems)}, in a run's training split: {dropped}); use "
                        "another task or raise task.eval_size")
    info = {"problems": len(problems), "split": split.report.to_dict(),
            "dropped_in_training": dropped}
    overlap = "".join(f"; {n} in the training split of {run}, dropped" for run,
                      n in dropped.items())
    say(f"{cfg.task.name}: {len(problems)} held-out problems, distinct by content from the task's "
         f"training split ({split.report.removed_other_side} training-side and "
         f"{split.report.removed_duplicates} duplicate draws removed; "
         f"{info['split']['space']['text']}){overlap}")
    return problems, info


def _trained_keys(model: str) -> set[str] | None:
    """Content keys of the training split of a run_dir (its config.yaml); None for a plain model."""
    config = RunDir(Path(model).expanduser()).config
    if not config.is_file():
        return None
    from areal_cli.runconfig.compose import load_yaml
    from areal_cli.tasks import load_problems

    try:
        task = load_yaml(config, private=False).task
        return {p.key for p in load_problems(task, "train")}
    except (ConfigError, ValueError) as err:
        raise EvalError(f"model={model}: cannot rebuild that run's training split to check "
                        f"overlap: {err}") from None


def _run_info(head: EvalRunConfig, cfgs: list[EvalRunConfig], models, wall_s: float) -> dict:
    keys = ("n_samples", "temperature", "top_p", "greedy", "max_new_tokens", "size", "seed")
    info = {k: getattr(head, k) for k in keys}
    info.update(engine=head.engine.name, workers=head.worker_count() if head.data_parallel() else 1,
                gpus=[int(g) for g in head.gpus])
    info.update(models={name: str(path) for name, path in models}, wall_s=round(wall_s, 2),
                tasks={cfg.task.name: asdict(cfg.task) for cfg in cfgs}, reward=asdict(head.reward))
    return info

"""After the last step: base vs trained greedy accuracy on held-out problems, as the run's last
lines.

The launcher runs it once every process of the run has stopped, so the evaluation has the whole
machine. The base model's figure depends only on (model, task, problems, decoding, reward), so it
is cached under ``AREAL_CACHE/eval``: a second run of the same task skips it. Both results go to
``<run_dir>/eval_final.json``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from areal_cli.config.schema import RootConfig
from areal_cli.durable import atomic_write
from areal_cli.rundir import RunDir
from areal_cli.runtime import usable_cores

EAGER_EVAL_TOKENS = 100_000
"""Problems × new tokens at most, of a closing evaluation that vLLM runs eagerly."""


def evaluate_run(cfg: RootConfig, run_dir: Path, say=print, gpus: str | None = None) -> dict | None:
    """Evaluate the base model and ``run_dir``'s final checkpoint; None when ``eval.at_end`` is off.
    ``gpus``: CUDA_VISIBLE_DEVICES of the run's first generation worker, where the evaluation runs
    (set before CUDA starts in this process; None = leave the environment as it is)."""
    if not cfg.eval.at_end:
        return None
    final = RunDir(run_dir).final
    if not (final / "config.json").is_file():
        say(f"final evaluation skipped: no checkpoint at {final}")
        return None
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    from transformers.utils import logging as hf_logging

    from areal_cli.eval import evaluate
    from areal_cli.model_source import resolve_model
    from areal_cli.tasks import load_problems

    hf_logging.disable_progress_bar()  # the closing lines stay readable

    problems = load_problems(cfg.task, "eval")[: cfg.eval.size or None]
    say(f"evaluating base and trained model on {len(problems)} held-out problems "
        f"({cfg.task.name} eval split, greedy, ≤ {cfg.rollout.max_new_tokens} new tokens) ...")
    # the KV cache sized for the evaluation's own batch: the run's engine.kv_cache_tokens was
    # resolved for its groups, and a cache too small for the evaluation's sequences is compacted
    # every step. vLLM starts without compilation and CUDA graphs for a small evaluation: its start
    # with them (~45 s, one GPU) outweighs the decode of a few thousand greedy tokens
    small = len(problems) * cfg.rollout.max_new_tokens <= EAGER_EVAL_TOKENS
    eager = cfg.engine.vllm.enforce_eager or small
    vllm = dataclasses.replace(cfg.engine.vllm, enforce_eager=eager)
    engine = dataclasses.replace(cfg.engine, kv_cache_tokens=0, vllm=vllm)
    options = dict(n_samples=1, temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens,
                   engine_cfg=engine, threads=usable_cores(), problems=problems)
    base_path = resolve_model(cfg.model)
    cache = _cache_path(cfg, base_path, problems)
    if cache.is_file():
        base = json.loads(cache.read_text())
        say("  base model: the figure of an earlier run (cached)")
    else:
        say("  base model:")
        base = _summary(evaluate(base_path, cfg.task, cfg.reward.verifier(), **options))
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, json.dumps(base))
    say("  trained model:")
    trained = _summary(evaluate(final, cfg.task, cfg.reward.verifier(), **options))
    out = {"task": cfg.task.name, "problems": len(problems), "base": {"model": cfg.model, **base},
           "trained": {"model": str(final), **trained},
           "gain_points": 100 * (trained["accuracy"] - base["accuracy"])}
    atomic_write(RunDir(run_dir).eval_final, json.dumps(out, indent=2) + "\n")
    for line in report(out):
        say(line)
    return out


def report(out: dict) -> list[str]:
    """The closing lines: both accuracies and the gain in points."""
    b, t = out["base"], out["trained"]
    return [f"held-out greedy accuracy, {out['problems']} {out['task']} problems this run never "
            "trained on:",
            f"  base     {100 * b['accuracy']:5.1f}%  (mean length {b['mean_length']:.0f} tokens)",
            f"  trained  {100 * t['accuracy']:5.1f}%  (mean length {t['mean_length']:.0f} tokens)"
            f"  {out['gain_points']:+.1f} points"]


def _summary(result: dict) -> dict:
    m = result["metrics"]
    return {"accuracy": m["accuracy"], "mean_length": m.get("mean_length", 0.0),
            "truncation_rate": m.get("truncation_rate", 0.0), "wall_s": result.get("wall_s", 0.0)}


def _cache_path(cfg: RootConfig, base_path: Path, problems) -> Path:
    """Keyed by everything that decides the base model's score."""
    from areal_cli.model_source import cache_dir

    key = json.dumps({"model": str(base_path),
                      "problems": [(p.id, p.prompt, p.answer) for p in problems],
                      "max_new_tokens": cfg.rollout.max_new_tokens,
                      "reward": cfg.reward.verifier().fn,
                      "partial": getattr(cfg.reward, "partial_credit", False),
                      "engine": cfg.engine.name, "dtype": cfg.engine.dtype,
                      "system": cfg.task.system_prompt}, sort_keys=True)
    return cache_dir() / "eval" / f"base-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"

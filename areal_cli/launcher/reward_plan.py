"""The reward-model process in a run's plan (reward.fn with a model or judge part): its command,
its device, and the checks that fail before anything starts (exit 2): a reward model that is no
sequence classifier, or whose head has several outputs and no reward.model.label."""

from __future__ import annotations

import sys

from areal_cli.config.reward_models import JudgeEngine
from areal_cli.config.schema import RootConfig
from areal_cli.runtime import physical_gpus

NAME = "reward-model"


def reward_notes(cfg: RootConfig) -> list[str]:
    """What the reward-model process serves, from where; ValueError naming the fix for a bad
    head."""
    from areal_cli.model_source import resolve_model
    from areal_cli.rewards.reward_model import head_config, label_index

    rc, lines = cfg.reward, []
    if "model" in rc.parts:
        path = resolve_model(rc.model.path)
        index = label_index(head_config(path), rc.model.label)
        lines.append(f"reward model {rc.model.path} → {path}, output {index}")
    if "judge" in rc.parts:
        judge = rc.judge.model or cfg.model
        lines.append(f"judge {judge} → {resolve_model(judge)} (frozen), "
                     f"verdict={rc.judge.verdict}, {judge_engine_note(cfg)}")
    weights = [float(w) for w in rc.weights] or [1.0] * len(rc.parts)
    lines.append("reward = "
                 + " + ".join(f"{w:g}·{p}" for w, p in zip(weights, rc.parts, strict=True)))
    return lines


def judge_engine_note(cfg: RootConfig) -> str:
    """Which engine runs the judge, where (the resolved reward.judge.engine)."""
    j = cfg.reward.judge
    where = f"GPU {','.join(map(str, cfg.reward.gpus))}" if cfg.reward.gpus else "the CPU"
    if j.engine == JudgeEngine.vllm:
        return (f"reward.judge.engine=vllm: a vllm.LLM on {where}, {j.gpu_memory_utilization:.0%} "
                "of its memory")
    return f"reward.judge.engine=hf: transformers on {where}"


def reward_proc(cfg: RootConfig, run_dir, visible: list[int], cpu_env: dict):
    """(name, argv, env) of the reward-model process; None when no part needs it."""
    if not cfg.reward.served:
        return None
    gpus = [int(g) for g in cfg.reward.gpus]
    missing = [g for g in gpus if g not in visible]
    if missing:
        raise ValueError(f"reward.gpus={gpus}: GPU id(s) {missing} do not exist here (visible: "
                         f"{visible or 'none'})")
    env = {"CUDA_VISIBLE_DEVICES": physical_gpus(gpus)} if gpus else {**cpu_env,
                                                                      "CUDA_VISIBLE_DEVICES": ""}
    return NAME, [sys.executable, "-m", "areal_cli.rewards.server", str(run_dir)], env

"""Settings bounded by one another, by the run or by this machine: values that lie in their own
range (``config/ranges.py``) but that a started process could never meet (a wait that outlasts the
timeout it runs under, a batch no step fills, a KV cache no index or memory can hold). Each problem
names the key, the most (or least) it may be and the fix. No torch import here."""

from __future__ import annotations

import json
from pathlib import Path

from areal_cli.config.ranges import INDEX_MAX
from areal_cli.config.schema import (
    RolloutConfig,
    RootConfig,
    kv_cache_tokens_needed,
    worker_concurrency,
)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def run_bounds(cfg: RootConfig) -> list[str]:
    """Every setting beyond what the rest of the config, the run or (a local run) this machine
    allows."""
    problems = _staleness(cfg) + _timing(cfg) + _batch(cfg)
    if cfg.launcher.name == "local":
        problems += _machine(cfg)
    return problems


def _staleness(cfg: RootConfig) -> list[str]:
    r, most = cfg.rollout, max(cfg.trainer.steps, RolloutConfig.max_staleness)
    if r.max_staleness <= most:
        return []
    return [f"rollout.max_staleness={r.max_staleness}: must be at most "
            f"trainer.steps={cfg.trainer.steps} (no sample can be staler in this run; runs shorter "
            f"than {RolloutConfig.max_staleness} steps may keep the default "
            f"{RolloutConfig.max_staleness}): use at most {most}"]


def _timing(cfg: RootConfig) -> list[str]:
    """Waits against the timeouts they run under."""
    lc, rc, out = cfg.launcher, cfg.reward, []
    if lc.heartbeat_s * 3 > lc.peer_timeout_s:
        out.append(f"launcher.heartbeat_s={lc.heartbeat_s:g} must be at most a third of "
                   f"launcher.peer_timeout_s={lc.peer_timeout_s:g}: lower heartbeat_s")
    # progress travels in the heartbeats: a shorter limit calls every busy process stuck
    if 0 < lc.progress_timeout_s < 3 * lc.heartbeat_s:
        out.append(f"launcher.progress_timeout_s={lc.progress_timeout_s:g}: must be 0 (never) or "
                   f"at least 3 × launcher.heartbeat_s = {3 * lc.heartbeat_s:g} (progress is "
                   "reported with each heartbeat): raise it or set 0")
    # every served request waits batch_wait_s first; past reward.timeout_s it is scored 0
    if rc.served and rc.batch_wait_s >= rc.timeout_s:
        out.append(f"reward.batch_wait_s={rc.batch_wait_s:g}: must be below reward.timeout_s="
                   f"{rc.timeout_s:g} (each request waits that long before it is scored, and a "
                   "reply after timeout_s counts as a timeout): lower reward.batch_wait_s below "
                   "it, or raise reward.timeout_s")
    return out


def _batch(cfg: RootConfig) -> list[str]:
    """A step's prompts against the training split; a worker's sequences against the KV cache's
    int32 indices."""
    t, task, r, out = cfg.trainer, cfg.task, cfg.rollout, []
    if task.size and t.batch_size > task.size:
        out.append(f"trainer.batch_size={t.batch_size}: must be at most task.size={task.size}, the "
                   "problems of the training split (a step draws distinct prompts; a larger batch "
                   "takes epochs of them to fill): lower batch_size or raise task.size")
    # page_size and workers < 1 are out of their ranges, reported there
    if not cfg.engine.kv_cache_tokens and cfg.engine.page_size >= 1 and r.workers >= 1:
        least = kv_cache_tokens_needed(cfg, 0)
        if least > INDEX_MAX:
            groups = worker_concurrency(cfg)
            out.append(f"rollout.group_size={r.group_size}: a rollout worker would hold at least "
                       f"{least} tokens of KV cache ({groups} groups at once × {r.group_size} "
                       f"samples × {least // (groups * r.group_size)} tokens), more than the "
                       f"{INDEX_MAX} its int32 indices reach: lower rollout.group_size, "
                       "rollout.max_concurrent (or trainer.batch_size) or rollout.max_new_tokens, "
                       "or add rollout.workers")
    return out


def _machine(cfg: RootConfig) -> list[str]:
    """Processes and threads against the CPU cores this machine gives areal."""
    from areal_cli.config.machine import cores

    r, out, n = cfg.rollout, [], cores()
    devices = max(n, len(cfg.cluster.gpus), len(r.gpus))  # GPUs named in the config count too
    if r.workers > devices:
        out.append(f"rollout.workers={r.workers}: must be at most the {n} CPU core(s) this machine "
                   "gives areal or the GPUs named in cluster.gpus / rollout.gpus (each worker is a "
                   "process with its own engine): lower it")
    threads = (("engine.threads", cfg.engine.threads), ("trainer.threads", cfg.trainer.threads))
    for key, v in threads:
        if v > n:
            out.append(f"{key}={v}: must be at most the {n} CPU core(s) this machine gives areal "
                       "(more threads only contend for them): lower it, or 0 = half the cores")
    if cfg.reward.workers > n:
        out.append(f"reward.workers={cfg.reward.workers}: must be at most the {n} CPU core(s) this "
                   "machine gives areal (each is a process, per rollout worker): lower it")
    return out


def kv_memory_problems(cfg: RootConfig, model_path: Path | None, engine_gpu: bool) -> list[str]:
    """The KV caches of a local run's CPU rollout workers against this machine's memory (each
    allocates its whole cache at start: engine.kv_cache_tokens, else at least what the run's
    groups need). On a GPU the engine holds its cache to engine.gpu_memory_utilization."""
    from areal_cli.config.machine import memory_mb

    if engine_gpu or model_path is None or cfg.launcher.name != "local":
        return []
    try:
        c = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return []  # a GGUF file or no config: the worker sizes it
    c = c.get("text_config", c)
    heads = c.get("num_attention_heads", 0)
    if not heads or "hidden_size" not in c or "num_hidden_layers" not in c:
        return []
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    per_token = (2 * c["num_hidden_layers"] * c.get("num_key_value_heads", heads) * head_dim
                 * DTYPE_BYTES.get(str(cfg.engine.dtype), 4))
    tokens = cfg.engine.kv_cache_tokens or kv_cache_tokens_needed(cfg, 0)
    need_mb = cfg.rollout.workers * tokens * per_token >> 20
    if need_mb <= memory_mb():
        return []
    if cfg.engine.kv_cache_tokens:
        key, fix = f"engine.kv_cache_tokens={tokens}", "lower it, or 0 = what the run needs"
    else:
        key, fix = (f"rollout.group_size={cfg.rollout.group_size}", "lower it, or "
                    "rollout.max_concurrent, trainer.batch_size or rollout.max_new_tokens")
    return [f"{key}: the KV cache of {cfg.rollout.workers} rollout worker(s) would take {need_mb} "
            f"MiB ({tokens} tokens each, {per_token} bytes a token), more than this machine's "
            f"{memory_mb()} MiB: {fix}"]

"""Every ``auto`` of a config made concrete, in one step: ``resolve(cfg, placement) -> cfg``.

The rules are config/resolve.py's (its table says what each ``auto`` becomes); the engine's own
``auto`` values come from its spec (``engines/<name>/spec.py``), which is why the step that applies
them lives here, above the engines, and not in config/.
"""

from __future__ import annotations

import copy
from pathlib import Path

from areal_cli.config import cpu_dtype
from areal_cli.config.choices import (
    Allocator,
    Dtype,
    OptimState,
    Share,
    Switch,
    WandbMode,
    WeightsBackend,
    WeightUpdate,
)
from areal_cli.config.resolve import (
    CPU,
    Placement,
    _auto,
    _compile,
    _dtype,
    _installed_allocator,
    _judge_engine,
    _switch,
    _wandb_mode,
    checkpointing,
    sharding,
)
from areal_cli.config.reward_models import JudgeEngine
from areal_cli.config.schema import EngineConfig, RootConfig
from areal_cli.engines import spec


def resolve(cfg: RootConfig, where: Placement = CPU) -> RootConfig:
    """A copy of ``cfg`` with every ``auto`` replaced by its concrete value for ``where``."""
    out = copy.deepcopy(cfg)
    if out.trainer.lora.rank > 0 and out.trainer.lora.target_experts:
        # the experts' adapters travel merged only (no engine applies them itself)
        out.engine.lora_merge = _switch(out.engine.lora_merge, True)
    out.engine = resolve_engine(out.engine, where.model_path, gpu=where.engine_gpu)
    if out.reward.dtype == "auto":
        out.reward.dtype = str(_dtype(Dtype.auto, bool(out.reward.gpus)))
    out.reward.judge.engine = _auto(JudgeEngine, out.reward.judge.engine,
                                    lambda: _judge_engine(out))
    t, w = out.trainer, out.weights
    t.dtype = _dtype(t.dtype, where.trainer_gpu)
    t.optim_state = _auto(OptimState, t.optim_state,
                          OptimState.float32 if where.trainer_gpu else OptimState.bfloat16)
    t.packing = _switch(t.packing, where.trainer_gpu)
    t.shared_prompts = _switch(t.shared_prompts, not where.trainer_gpu)
    t.compile = _switch(t.compile, _compile(where))
    t.shard = _switch(t.shard, sharding(t.ranks, where))
    t.logprob_chunk_tokens = t.logprob_chunk_tokens or (2048 if where.trainer_gpu else 256)
    w.dtype = _auto(Dtype, w.dtype, out.engine.dtype)
    w.backend = _auto(WeightsBackend, w.backend, _backend(where))
    device = w.backend in (WeightsBackend.nccl, WeightsBackend.ipc)
    w.staged = _switch(w.staged, device)
    w.bucket_mb = w.bucket_mb or (1024 if device else 32)
    if t.activation_checkpointing == Switch.auto:
        every, _ = checkpointing(out, where)
        t.activation_checkpointing = Switch.false if every is None else Switch.true
        t.checkpoint_every = every or t.checkpoint_every
    # the launcher's plan turns it to alternate where the trainer does not fit beside the engine
    out.cluster.share = _auto(Share, out.cluster.share, Share.concurrent)
    out.launcher.allocator = _auto(Allocator, out.launcher.allocator, _installed_allocator)
    out.logging.wandb_mode = _auto(WandbMode, out.logging.wandb_mode, _wandb_mode)
    return out


def _backend(where: Placement) -> WeightsBackend:
    """NCCL between GPUs; CUDA IPC where a rollout worker shares trainer rank 0's GPU (NCCL refuses
    two ranks on one GPU); gloo on the CPU."""
    if not where.trainer_gpu:
        return WeightsBackend.gloo
    return WeightsBackend.ipc if where.shared_gpu else WeightsBackend.nccl


def resolve_engine(engine: EngineConfig, model_path: Path | None = None, updates: bool = True,
                   gpu: bool | None = None) -> EngineConfig:
    """A copy of ``engine`` with its ``auto`` values resolved. ``updates=False`` for an engine that
    never receives weights (an evaluation): engine.weight_update auto = reload (vLLM's default
    transfer). ``gpu``: the engine computes on a GPU (None = where a GPU driver is present here;
    always for an engine that computes on GPUs only)."""
    e = copy.deepcopy(engine)
    if spec(e.name).gpu_only:
        gpu = True
    elif gpu is None:
        gpu = cpu_dtype.gpu_driver()
    e.dtype = _dtype(e.dtype, gpu)
    e.lm_head_fp32 = _switch(e.lm_head_fp32, spec(e.name).fp32_logits)
    e.lora_merge = _switch(e.lora_merge, spec(e.name).merges_lora)
    e.weight_update = _auto(
        WeightUpdate, e.weight_update,
        lambda: _weight_update(e, model_path) if updates else WeightUpdate.reload)
    return e


def _weight_update(e: EngineConfig, model_path: Path | None) -> WeightUpdate:
    return spec(e.name).weight_update(e, model_path)

"""What every ``auto`` of the config becomes: the rules, and ``Placement``, their input. The step
that applies them all at once, ``resolve(cfg, placement) -> cfg``, is ``runconfig/autos.py`` (the
engine's values come from its spec, above config/).

``areal train`` calls it once, when it plans the run (``launcher/plan.py``), before config.yaml is
written into the run directory; the trainer, the rollout workers and the controller read that file
and never resolve or change it. What runs without a plan (``areal eval``, the evaluator, tests that
build a config) calls the same step once at its entry. Resolving a resolved config changes nothing.

What each ``auto`` becomes (the concrete value depends on where the processes compute, the engine
and the weight backend, so the inputs are a ``Placement``, which needs no GPU to build):

- engine.dtype, trainer.dtype: bfloat16 where the process computes on a GPU; on the CPU bfloat16
  only where the processor has it natively, else float32 (config/cpu_dtype.py)
- engine.lm_head_fp32: true where the engine's logits are float32 (vllm), else false
- engine.weight_update: vllm: inplace for a known fused layout (any TP), else reload; hf: inplace
- engine.lora_merge: true with vllm (merged weights through its in-place update), false with hf
  (the adapter); true with trainer.lora.target_experts (the experts' adapters travel merged)
- reward.judge.engine: vllm where reward.gpus is set and engine=vllm (vLLM is installed), else hf
- weights.dtype: engine.dtype
- reward.dtype: bfloat16 on reward.gpus, else the CPU's rule as for engine.dtype
- weights.backend: nccl when the trainer is on GPUs and no rollout worker shares rank 0's GPU; ipc
  (CUDA IPC) when one does; gloo on the CPU
- weights.staged: true with nccl and ipc, false with gloo
- weights.bucket_mb (0): 1024 with nccl and ipc, 32 with gloo
- trainer.optim_state: float32 on GPUs, bfloat16 on the CPU
- trainer.packing: true for the trainer on GPUs, false on the CPU
- trainer.activation_checkpointing: true on the CPU; on GPUs the least recomputation whose
  estimate fits the card (none, every other layer: checkpoint_every 2, every layer;
  config/memory_plan.py)
- trainer.compile: true for the trainer on GPUs with a dense model of at least 1B decoder-layer
  parameters; false for a mixture of experts
- trainer.shard: true for several ranks, and for one GPU rank with a model of at least 1B
  decoder-layer parameters, every expert counted (or one not known yet); false for one CPU rank
- trainer.logprob_chunk_tokens (0): 2048 on GPUs, 256 on the CPU
- cluster.share: concurrent; the launcher's plan of a shared GPU turns it to alternate where the
  trainer fits only while the engine sleeps (launcher/share.py)
- launcher.allocator: tcmalloc, else jemalloc, else system: what is installed here
- logging.wandb_mode: WANDB_MODE if set, else online where a W&B API key is configured, else
  offline
"""

from __future__ import annotations

import ctypes.util
import netrc
import os
import typing
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum
from pathlib import Path

from areal_cli.config import cpu_dtype, memory_plan
from areal_cli.config.choices import (
    Allocator,
    Dtype,
    OptimState,
    Switch,
    WandbMode,
)
from areal_cli.config.reward_models import JudgeEngine
from areal_cli.config.schema import RootConfig, WeightsConfig


@dataclass(frozen=True)
class Placement:
    """Where a run's processes compute, as the launcher planned it: the inputs of ``resolve``."""

    trainer_gpu: bool = False
    """The trainer ranks run on GPUs."""
    rollout_gpu: bool | None = None
    """The rollout workers' engines run on GPUs; None = as the trainer."""
    shared_gpu: bool = False
    """A rollout worker shares trainer rank 0's GPU (NCCL refuses two ranks on one GPU)."""
    model_path: Path | None = None
    """The model's local directory (its config.json decides engine.weight_update with vllm); None =
    not fetched yet (a --dry-run of an uncached Hub model): engine.weight_update stays auto."""
    gpu_memory_bytes: int = 0
    """Memory of trainer rank 0's GPU; 0 = not known here (a plan for other nodes)."""

    @property
    def engine_gpu(self) -> bool:
        """The rollout workers' engines run on GPUs (``rollout_gpu``, else as the trainer)."""
        return self.trainer_gpu if self.rollout_gpu is None else self.rollout_gpu


CPU = Placement()
"""Every process on the CPU (no GPU visible, or a config that was not planned)."""


def unresolved(cfg) -> list[str]:
    """The keys of ``cfg`` (a config dataclass) still ``auto``: [] once resolved."""
    out, hints = [], typing.get_type_hints(type(cfg))
    for f in fields(cfg):
        v, t = getattr(cfg, f.name), hints[f.name]
        if is_dataclass(v):
            out += [f"{f.name}.{k}" for k in unresolved(v)]
        elif isinstance(t, type) and issubclass(t, Enum) and str(v) == "auto":
            out.append(f.name)  # an Enum only: reward.fn's auto is no choice
    return out


def require_resolved(cfg: RootConfig, source: str) -> RootConfig:
    """``cfg`` if it holds no ``auto``; else ValueError naming the keys (a process reads only a
    planned config; ``source`` says where it came from)."""
    left = unresolved(cfg)
    if left:
        raise ValueError(f"{source}: {', '.join(left)} still auto: start the run with "
                         "`areal train`, which resolves them when it plans the run (or call "
                         "areal_cli.runconfig.autos.resolve)")
    return cfg


def bucket_bytes(w: WeightsConfig) -> int:
    """weights.bucket_mb of a resolved config in bytes (both ends of the broadcast must agree);
    ValueError for bucket_mb=0 (auto), which ``resolve`` makes concrete."""
    if w.bucket_mb <= 0:
        raise ValueError(f"weights.bucket_mb={w.bucket_mb}: resolve the config first "
                         "(areal_cli.config.resolve)")
    return w.bucket_mb << 20


def _auto(choices: type[Enum], value, concrete):
    """``value`` as a member of ``choices``; ``auto`` becomes ``concrete`` (called if callable)."""
    member = choices(str(value).lower() if isinstance(value, bool) else value)
    if member.value != "auto":
        return member
    return choices(concrete() if callable(concrete) else concrete)


def _dtype(value, gpu: bool) -> Dtype:
    """auto: bfloat16 on a GPU; on the CPU the dtype the processor computes natively."""
    return _auto(Dtype, value, Dtype.bfloat16 if gpu else lambda: cpu_dtype.choose().dtype)


COMPILE_MIN_PARAMS = 1e9
"""trainer.compile=auto compiles from this many decoder-layer parameters up: compiling shortened a
step at the Qwen2.5-1.5B size (BENCHMARKS.md "Speed levers, Qwen2.5-1.5B layout, one trainer
rank"); smaller models were not measured."""


def _compile(where: Placement) -> bool:
    """trainer.compile=auto: the trainer on GPUs and a dense model of at least
    ``COMPILE_MIN_PARAMS`` (the CPU's first step would compile for minutes). Not a mixture of
    experts: dynamo traces each decoder layer on its own, and an MoE layer's routing and grouped
    matmul traced for minutes, with the GPU idle (the Qwen3-30B-A3B layout's 48 layers: no step in
    the first 7 minutes, BENCHMARKS.md "Mixture of experts"); its experts run as grouped matmuls,
    which compiling would not fuse anyway."""
    from areal_cli import moe

    if not where.trainer_gpu or where.model_path is None or moe.is_moe(where.model_path):
        return False
    return layer_params(where.model_path) >= COMPILE_MIN_PARAMS


SHARD_MIN_PARAMS = 1e9
"""trainer.shard=auto shards one GPU rank from this many decoder-layer parameters up (below it the
step is host-bound and FSDP's per-layer work is host time; above it FSDP's resharding after each
layer's forward keeps the bfloat16 copy of only one layer's weights)."""


def sharding(ranks: int, where: Placement) -> bool:
    """trainer.shard=auto: FSDP2 for several ranks; for one rank only on a GPU and for a model of at
    least ``SHARD_MIN_PARAMS`` (or one not known here)."""
    if ranks > 1:
        return True
    if not where.trainer_gpu:
        return False
    if where.model_path is None:
        return True
    try:
        return layer_params(where.model_path) >= SHARD_MIN_PARAMS
    except (OSError, ValueError):
        return True


def layer_params(model_path: Path) -> float:
    """The matmul weights of the decoder layers of the Llama-style model at ``model_path`` (its
    config.json): attention q, k, v, o and the gated MLP, or in a sparse layer every expert
    (``moe.mlp_params``); 0 for a config without those keys."""
    import json
    from types import SimpleNamespace

    from areal_cli import moe

    c = json.loads((Path(model_path) / "config.json").read_text())
    c = c.get("text_config", c)
    try:
        h, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        mlp = moe.mlp_params(SimpleNamespace(**c))
    except (KeyError, AttributeError):
        return 0.0
    d = c.get("head_dim") or h // heads
    kv = c.get("num_key_value_heads") or heads
    return float(layers * (2 * h * heads * d + 2 * h * kv * d) + sum(mlp))


def _judge_engine(cfg: RootConfig) -> JudgeEngine:
    """reward.judge.engine=auto: on reward.gpus the run's own engine where it can serve the judge
    (with engine=vllm, vLLM is installed), else hf."""
    if cfg.reward.gpus and cfg.engine.name in set(JudgeEngine):
        return JudgeEngine(cfg.engine.name)
    return JudgeEngine.hf


def checkpointing(cfg: RootConfig, where: Placement) -> tuple[int | None, int]:
    """``(every, estimated bytes)`` of ``trainer.activation_checkpointing=auto`` for a config whose
    other keys are resolved: every layer (1) on the CPU and wherever the card or the model is not
    known here (estimate 0); on GPUs ``memory_plan.choose``'s (None = no checkpointing)."""
    t = cfg.trainer
    lay = _layout(where)
    if lay is None or not where.gpu_memory_bytes:
        return t.checkpoint_every, 0  # no config.json of a decoder-only layout: the safe choice
    return memory_plan.choose(lay, where.gpu_memory_bytes, micro_batch_tokens=t.micro_batch_tokens,
                              chunk=t.logprob_chunk_tokens, **_states(cfg))


def _layout(where: Placement) -> memory_plan.Layout | None:
    """The trainer's model layout where it trains on a GPU and its config.json reads as a
    decoder-only layout; None elsewhere."""
    if not where.trainer_gpu or where.model_path is None:
        return None
    try:
        return memory_plan.Layout.from_config(where.model_path)
    except (OSError, KeyError, TypeError, ValueError):
        return None


def resident(cfg: RootConfig, where: Placement) -> int:
    """``memory_plan.resident_bytes`` of a resolved config on its trainer's GPU (0 where the card
    or the model is not known here)."""
    lay = _layout(where)
    return 0 if lay is None else memory_plan.resident_bytes(lay, **_states(cfg))


def _states(cfg: RootConfig) -> dict:
    """What sets the trainer's weights and optimizer memory, as ``memory_plan`` takes it."""
    from areal_cli import lora

    t = cfg.trainer
    return dict(ranks=t.ranks, moments_bytes=4 if t.optim_state == OptimState.bfloat16 else 8,
                lora=t.lora.rank > 0, frozen_bytes=4 if t.dtype == Dtype.float32 else 2,
                expert_rank=t.lora.rank if t.lora.target_experts else 0,
                staged=cfg.weights.staged == Switch.true and not lora.sends_adapter(cfg))


def _switch(value, on: bool) -> Switch:
    return _auto(Switch, value, Switch.true if on else Switch.false)


ALLOCATORS = {"tcmalloc": ("tcmalloc_minimal", "libtcmalloc-minimal4"),
              "jemalloc": ("jemalloc", "libjemalloc2")}
"""malloc name → (library name for ctypes.util.find_library, Debian package)."""


def find_allocator(choice: str) -> tuple[str, str] | None:
    """(name, library) of the malloc ``choice`` ("auto": tcmalloc, else jemalloc) installed here."""
    for name in ALLOCATORS if choice == "auto" else [choice] if choice in ALLOCATORS else []:
        lib = ctypes.util.find_library(ALLOCATORS[name][0])
        if lib:
            return name, lib
    return None


def _installed_allocator() -> Allocator:
    found = find_allocator("auto")
    return Allocator(found[0]) if found else Allocator.system


WANDB_ALIASES = {"dryrun": "offline", "run": "online"}
"""WANDB_MODE values the wandb client also accepts, and the mode each means."""


def _wandb_mode() -> str:
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if env:
        env = WANDB_ALIASES.get(env, env)
        if env not in {m.value for m in WandbMode} - {"auto"}:
            raise ValueError(f"WANDB_MODE={os.environ['WANDB_MODE']} (logging.wandb_mode=auto "
                             "follows it): set WANDB_MODE to online, offline or disabled, or "
                             "unset it")
        return env
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return "online" if host and netrc.netrc().authenticators(host) else "offline"
    except (OSError, netrc.NetrcParseError):
        return "offline"

"""The generation engine's config (``engine.*``): the keys every engine reads, flat, and one section
per engine for the keys only that engine reads (``engine.vllm.*``, ``engine.hf.*``).

``MOVED_KEYS`` maps each key that was flat before the sections existed to its new place: an old
key on the command line or in a YAML is an error naming the new one (``moved_key_problems``). No
torch import here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_cli.config.choices import CpuBatching, Dtype, PauseMode, Switch, WeightUpdate


@dataclass
class VLLMConfig:
    """What only engine=vllm reads (``engine.vllm.*``)."""

    tensor_parallel_size: int = 1
    """GPUs per rollout worker."""
    pause_mode: PauseMode = PauseMode.keep
    """Pause on weight update: "keep" (unfinished sequences keep their KV of the old weights and go
    on under the new ones; the pause is the swap alone) | "abort" (they are aborted and prefilled
    again under the new weights)."""
    enforce_eager: bool = False
    """No torch.compile / CUDA graphs (starts sooner, decodes slower)."""
    max_model_len: int = 0
    """Longest prompt + response in tokens; 0 = the model's own limit."""
    max_num_seqs: int = 0
    """Most sequences decoded at once; 0 = vLLM's default (raise it for asynchronous runs, where up
    to (max_staleness + 1) × batch_size groups are in flight)."""
    staging: bool = True
    """engine.weight_update=inplace: receive each update behind generation into a staging copy of
    the weights where the GPU has room for it (the pause is then the swap). false: every update is
    received during the pause, straight into the engine's weights (no copy: its memory stays the
    engine's; the trainer's broadcast runs on GPUs that are not generating)."""
    staged_tp: bool = False
    """engine.weight_update=inplace at engine.vllm.tensor_parallel_size > 1: receive each update
    behind generation into a staging copy as at TP 1 (the pause is the swap) instead of during the
    pause. Off by default: the receiving thread's broadcasts then run beside the engine's own TP
    collectives on a second NCCL communicator, not yet measured not to hang."""
    log_stats: bool = False
    """vLLM's own counters every 10 s in the rollout worker's log (requests running and waiting,
    prompt and generation tokens/s, KV cache use), beside the worker's "generation:" line of what it
    saw finish."""


@dataclass
class HFConfig:
    """What only engine=hf reads (``engine.hf.*``)."""

    cpu_batching: CpuBatching = CpuBatching.slots
    """On the CPU: "slots" (one batched forward of every live sequence over a contiguous KV cache,
    2-4x the tokens/s of "paged" at 32-64 sequences on one core: docs/cpu.md) | "paged"
    (transformers' continuous batching, always used on a GPU)."""


@dataclass
class EngineConfig:
    """The generation engine of every rollout worker."""

    name: str = "hf"
    """"hf" (embedded: the slot loop on the CPU, transformers continuous batching on a GPU) | "vllm"
    (GPU; `pip install 'areal-cli[vllm]'`)."""
    dtype: Dtype = Dtype.auto
    """Weights of the engine: "auto" (= bfloat16) | "bfloat16" | "float16" | "float32". float16 with
    trainer.dtype=float16 brings the behaviour and trainer logprobs closer than bfloat16
    (docs/gpu.md)."""
    max_batch_tokens: int = 2048
    """Tokens per engine forward (prefill chunks + decodes)."""
    kv_cache_tokens: int = 0
    """KV cache size in tokens; 0 = what the run needs, resolved before the run starts (groups
    generating at once × group_size × pages for the longest prompt + max_new_tokens per turn); on a
    GPU at most what fits in engine.gpu_memory_utilization of its free memory."""
    page_size: int = 64
    """KV cache page (block) size in tokens (also the unit the run's KV cache is planned in)."""
    threads: int = 0
    """torch CPU threads of a rollout worker; 0 = half the cores (at least 1)."""
    gpu_memory_utilization: float = 0.5
    """Fraction of the GPU the engine may use (vLLM: of the whole GPU; hf: of its free memory, for
    the KV cache)."""
    weight_update: WeightUpdate = WeightUpdate.auto
    """vLLM: how new weights load. "reload" = vLLM's NCCL transfer in checkpoint format with its
    layer-wise reload (any model); "inplace" = areal's bucketed broadcast through the engine's
    weight loaders into its parameters (Llama/Mistral/Qwen2/Qwen3 layouts, any
    engine.vllm.tensor_parallel_size), received into a staging copy while generation goes on at TP
    1 (and at TP > 1 with engine.vllm.staged_tp) where the GPU has room (the pause is the swap),
    else during the pause; "auto" = inplace where it applies, else reload (hf: inplace, its only
    way)."""
    lora_merge: Switch = Switch.auto
    """trainer.lora.rank > 0: the trainer merges W0 + (alpha/rank)·B·A and sends full weights
    through the weight broadcast, instead of the adapter alone (the engine then runs without LoRA).
    "auto" = true with vllm (its merged in-place updates hold generation far shorter than loading
    the adapter through vLLM's LoRA API: BENCHMARKS.md "LoRA"), false with hf (its merge of the
    received adapter is in place); true with trainer.lora.target_experts."""
    lm_head_fp32: Switch = Switch.auto
    """Logits in float32 (bf16 inputs, fp32 accumulate and output) in the engine and in the trainer,
    so behaviour and recomputed logprobs agree (bf16 logits are rounded to 1/8 at |logit| >= 16).
    "auto" = on with engine=vllm (vLLM's head_dtype=float32), off with hf; "true" | "false"."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """What only engine=vllm reads."""
    hf: HFConfig = field(default_factory=HFConfig)
    """What only engine=hf reads."""


MOVED_KEYS: dict[str, str] = {
    "engine.tensor_parallel_size": "engine.vllm.tensor_parallel_size",
    "engine.pause_mode": "engine.vllm.pause_mode",
    "engine.enforce_eager": "engine.vllm.enforce_eager",
    "engine.max_model_len": "engine.vllm.max_model_len",
    "engine.max_num_seqs": "engine.vllm.max_num_seqs",
    "engine.staging": "engine.vllm.staging",
    "engine.staged_tp": "engine.vllm.staged_tp",
    "engine.log_stats": "engine.vllm.log_stats",
    "engine.cpu_batching": "engine.hf.cpu_batching",
}
"""Keys that were flat in engine.* before the engine sections, → where they are now."""


def moved_key_problem(key: str) -> str:
    """"engine.max_model_len moved to engine.vllm.max_model_len" for a moved ``key`` (dotted, from
    the config's root); "" for any other key."""
    new = MOVED_KEYS.get(key)
    return f"{key} moved to {new}" if new else ""


def moved_override_problems(overrides: list[str]) -> list[str]:
    """A problem for each ``key=value`` override (``+key``, ``~key`` too) of a moved key."""
    keys = (o.partition("=")[0].lstrip("+~") for o in overrides)
    return [p for p in map(moved_key_problem, keys) if p]


def moved_key_problems(tree) -> list[str]:
    """A problem for each moved key that the mapping ``tree`` (a config as read from YAML: a dict
    or an OmegaConf DictConfig) still holds at its old place."""
    out = []
    for key in MOVED_KEYS:
        node = tree
        for part in key.split("."):
            node = node.get(part) if _is_mapping(node) and part in node else _MISSING
        if node is not _MISSING:
            out.append(moved_key_problem(key))
    return out


_MISSING = object()


def _is_mapping(node) -> bool:
    return hasattr(node, "keys") and hasattr(node, "get")

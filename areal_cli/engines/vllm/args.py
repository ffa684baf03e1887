"""What engine=vllm hands vLLM: the ``vllm.LLM`` arguments of a rollout worker's engine
(``llm_kwargs``), the LoRA rank vLLM accepts (``vllm_lora_rank``) and a request's structured-output
parameters (``structured_outputs``)."""

from __future__ import annotations

from areal_cli.config.choices import Switch, WeightUpdate
from areal_cli.config.resolve import unresolved
from areal_cli.config.schema import EngineConfig

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.26 accepts for max_lora_rank."""


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds ``rank``; ValueError naming the fix above
    512."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"trainer.lora.rank={rank}: vLLM serves adapters of rank <= "
                     f"{VLLM_LORA_RANKS[-1]}; lower trainer.lora.rank, or set "
                     "engine.lora_merge=true to send merged weights")


def llm_kwargs(e: EngineConfig, seed: int, index: int, lora_rank: int = 0,
               sleep_mode: bool = False, routing: bool = False) -> dict:
    """Arguments of ``vllm.LLM`` for rollout worker ``index`` of a run seeded ``seed`` (``e``
    resolved);
    ``lora_rank`` > 0: LoRA enabled for one adapter of that rank (the policy's), and no weight
    transfer engine (the base weights never change); ``sleep_mode``: vLLM's sleep mode
    (cluster.share=alternate); ``routing``: MoE, each request's routed experts returned
    (``routing.py``)."""
    if unresolved(e):
        raise ValueError(f"engine.{', engine.'.join(unresolved(e))}=auto: resolve the config first "
                         "(areal_cli.config.resolve)")
    kw = dict(dtype=str(e.dtype), seed=seed * 1000 + index,
              gpu_memory_utilization=e.gpu_memory_utilization,
              tensor_parallel_size=e.vllm.tensor_parallel_size,
              enforce_eager=e.vllm.enforce_eager, logprobs_mode="processed_logprobs",
              enable_prefix_caching=True)
    if lora_rank > 0:
        kw.update(enable_lora=True, max_lora_rank=vllm_lora_rank(lora_rank), max_loras=1)
    elif e.weight_update == WeightUpdate.inplace:
        kw["worker_extension_cls"] = "areal_cli.engines.vllm.inplace.InplaceWorker"
    else:
        kw["weight_transfer_config"] = dict(backend="nccl")
    if e.lm_head_fp32 == Switch.true:
        kw["hf_overrides"] = {"head_dtype": "float32"}
    # a request's grammar (Sequence.grammar) is Lark of llguidance: vLLM's guidance backend
    kw["structured_outputs_config"] = dict(backend="guidance")
    if e.vllm.max_num_seqs:
        kw["max_num_seqs"] = e.vllm.max_num_seqs
    if e.vllm.max_model_len:
        kw["max_model_len"] = e.vllm.max_model_len
    if e.vllm.log_stats:
        kw["disable_log_stats"] = False
    if sleep_mode:
        kw["enable_sleep_mode"] = True
    if routing:
        kw["enable_return_routed_experts"] = True
    return kw


def structured_outputs(grammar: str):
    """vLLM's structured-output parameters of a request under ``grammar`` (Lark, llguidance's
    dialect: ``Sequence.grammar``); None for an unconstrained one."""
    if not grammar:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(grammar=grammar)

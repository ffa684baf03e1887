"""The model architectures a run can train, decided from config.json alone, and ``ModelError``.

``model_source.py`` (aliases, paths, GGUF) and ``hub.py`` (Hub ids) both refuse with these.
"""

from __future__ import annotations

import json
from pathlib import Path


class ModelError(ValueError):
    """A model that cannot be found or loaded; the message names what to do."""


# model_type → the dense causal-LM architecture the trainer (FSDP2 over model.model.layers) and the
# in-place update (q/k/v and gate/up fused by vLLM, every other name kept) are written for
DENSE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
         "mistral": "MistralForCausalLM"}
# model_type → the mixture-of-experts causal LMs: the experts of each sparse layer are 3D parameters
# in transformers 5 (sharded by FSDP2 like the rest, run as a grouped GEMM), the router a module of
# its own (routing replay wraps it: moe.py)
MOE = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
       "olmoe": "OlmoeForCausalLM", "mixtral": "MixtralForCausalLM"}
SUPPORTED = {**DENSE, **MOE}
NAMES = "Llama, Qwen2/2.5, Qwen3, Mistral; MoE: Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral"


def check_supported(path: Path, label: str) -> None:
    """Refuse, from ``path``/config.json, a model that the trainer or the weight update cannot
    handle."""
    config = json.loads((Path(path) / "config.json").read_text())
    why = unsupported(config)
    if why:
        raise ModelError(f"{label}: {why}. areal trains causal LMs of these model types: "
                         f"{', '.join(SUPPORTED)} ({NAMES})")


def unsupported(config: dict) -> str:
    """Why a config.json describes a model areal cannot train; "" when it can."""
    kind = config.get("model_type", "")
    archs = list(config.get("architectures") or [])
    experts = [k for k in ("num_experts", "num_local_experts", "n_routed_experts") if config.get(k)]
    if (experts or "moe" in kind) and kind not in MOE:
        return (f"model_type={kind} is a mixture-of-experts layout areal does not know "
                f"({experts[0] if experts else kind}): routing replay and the load-balancing loss "
                "need a router per sparse layer as transformers builds it for "
                f"{', '.join(MOE)}")
    if "vision_config" in config or "audio_config" in config or kind.endswith(("_vl", "_omni")):
        return (f"model_type={kind} is a multimodal (vision/audio) model: rollouts, the trainer "
                "and the weight update handle text-only causal LMs")
    if kind not in SUPPORTED:
        return (f"model_type={kind or '(none)'} (architectures {archs}) is not an architecture "
                "areal supports")
    if archs and SUPPORTED[kind] not in archs:
        return f"architectures {archs}: the trainer needs the causal-LM head {SUPPORTED[kind]}"
    return ""

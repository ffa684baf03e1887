"""What engine=vllm declares: it loads its model itself, spans
``engine.vllm.tensor_parallel_size`` GPUs, computes logprobs with a float32 head, and receives
weights through its own transfer (``weights.py``: in place through its loaders, or a layer-wise
reload): over NCCL between GPUs, and in place through CUDA IPC on a GPU it shares with trainer
rank 0."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from areal_cli.config.choices import WeightUpdate
from areal_cli.config.schema import EngineConfig, RootConfig
from areal_cli.engines.spec import EngineSpec


@dataclass(frozen=True)
class VLLMSpec(EngineSpec):
    """vLLM's own weight transfer: the planner's answers differ from the broadcast's."""

    def weight_update(self, engine: EngineConfig, model_path: Path | None) -> WeightUpdate:
        if model_path is None:
            return WeightUpdate.auto
        from areal_cli.engines.vllm.weights import choose_weight_update

        return WeightUpdate(choose_weight_update("auto", model_path,
                                                 engine.vllm.tensor_parallel_size)[0])

    def weight_notes(self, asked: RootConfig, cfg: RootConfig,
                     model_path: Path | None) -> list[str]:
        from areal_cli.engines.vllm.weights import choose_weight_update, group_size, rank_offset

        w, tp, wt = cfg.rollout.workers, cfg.engine.vllm.tensor_parallel_size, cfg.weights
        if model_path is None:
            why = "decided from config.json once the model is fetched"
        else:
            why = choose_weight_update(asked.engine.weight_update, model_path, tp)[1]
        how = {"inplace": (f"in place (areal's bucketed broadcast, {wt.bucket_mb} MiB buckets, "
                           "through the engine's weight loaders; staged behind generation at TP 1 "
                           "where the GPU has room)"),
               "reload": "layer-wise reload (vLLM nccl transfer in checkpoint format)",
               "auto": "inplace or reload"}[cfg.engine.weight_update]
        if cfg.weights.backend == "ipc":
            return [f"engine.weight_update={cfg.engine.weight_update}: {how}; {why}",
                    "CUDA IPC: trainer rank 0 hands each bucket to rollout-0 on their shared GPU"]
        lines = [f"engine.weight_update={cfg.engine.weight_update}: {how}; {why}",
                 f"one NCCL group of {group_size(w, tp)} ranks: trainer rank 0 + {w} vLLM "
                 f"worker(s) × {tp} GPU rank(s)"]
        lines += [f"  rollout-{i}: "
                  + (f"ranks {rank_offset(i, tp)}..{rank_offset(i, tp) + tp - 1}" if tp > 1
                                        else f"rank {rank_offset(i, tp)}") for i in range(w)]
        return lines

    def check_shared_gpu(self, cfg: RootConfig, gpu: int) -> None:
        from areal_cli import lora  # torch: not at import (the config checks import this spec)

        if cfg.engine.weight_update == WeightUpdate.reload and not lora.sends_adapter(cfg):
            raise ValueError(f"engine=vllm on GPU {gpu} beside trainer rank 0: "
                             "engine.weight_update=reload is vLLM's own NCCL transfer, which "
                             "cannot join two processes of one GPU. Use "
                             "engine.weight_update=inplace (Llama, Mistral, Qwen2 and Qwen3 "
                             "layouts), or give the trainer a GPU of its own "
                             "(e.g. cluster.gpus=[0,1])")

    def shared_card(self, cfg: RootConfig, card: int, model_path: Path | None) -> int:
        return int(card * (1 - cfg.engine.gpu_memory_utilization)) - staging_bytes(cfg, model_path)

    def share_why(self, cfg: RootConfig, model_path: Path | None) -> str:
        staging = staging_bytes(cfg, model_path)
        share = cfg.engine.gpu_memory_utilization
        what = (f"engine.gpu_memory_utilization={share:g} of the GPU: its weights, KV cache and "
                "activations")
        if staging:
            what += (f"; and {staging / 2**30:.1f} GiB beside it to receive each update behind "
                     "generation (a staging copy of the weights, two buckets)")
        return what


def staging_bytes(cfg: RootConfig, model_path: Path | None) -> int:
    """Bytes a vLLM worker allocates beside its share to receive updates behind generation: a copy
    of the weights in the wire dtype and two bucket buffers (0 without staging, with a LoRA adapter
    or where the model's layout is not known here)."""
    from areal_cli import lora

    e, w = cfg.engine, cfg.weights
    # with lora_merge auto (true for vllm), merged full weights travel
    adapter = lora.enabled(cfg) and e.lora_merge == "false"
    if not e.vllm.staging or adapter or model_path is None:
        return 0
    from areal_cli.config.memory_plan import Layout

    try:
        params = Layout.from_config(model_path).params
        update = SPEC.weight_update(e, model_path) if e.weight_update == "auto" else e.weight_update
    except (OSError, KeyError, TypeError, ValueError):
        return 0
    if update != WeightUpdate.inplace:
        return 0
    # before resolution: the wire dtype auto is engine.dtype, bfloat16 on the GPU; 1 GiB buckets
    elem = {"float32": 4}.get(str(w.dtype if w.dtype != "auto" else e.dtype), 2)
    wire = params * elem
    return wire + 2 * min((w.bucket_mb or 1024) << 20, wire)


# asleep (sleep level 1: KV cache freed, weights in host memory) vLLM keeps its CUDA context, the
# CUDA graphs' pool and what was allocated outside its sleep-mode allocator: 4 GiB, an estimate
SPEC = VLLMSpec("vllm", loads_model=True, tensor_parallel=True, fp32_logits=True, merges_lora=True,
                gpu_only=True, asleep_bytes=4 * 1024**3,
                lora_apply="each vLLM worker loads it through vLLM's LoRA API (a LoRARequest of a "
                           "tmpfs directory, load_inplace)",
                package="vllm", install="pip install 'areal-cli[vllm]' (GPU machines only)")

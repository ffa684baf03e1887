"""What engine=vllm declares: it loads its model itself, spans ``engine.tensor_parallel_size`` GPUs,
computes logprobs with a float32 head, and receives weights through its own transfer
(``weights.py``: in place through its loaders, or a layer-wise reload), over NCCL only."""

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
                                                 engine.tensor_parallel_size)[0])

    def weight_notes(self, asked: RootConfig, cfg: RootConfig,
                     model_path: Path | None) -> list[str]:
        from areal_cli.engines.vllm.weights import choose_weight_update, group_size, rank_offset

        w, tp, wt = cfg.rollout.workers, cfg.engine.tensor_parallel_size, cfg.weights
        if model_path is None:
            why = "decided from config.json once the model is fetched"
        else:
            why = choose_weight_update(asked.engine.weight_update, model_path, tp)[1]
        how = {"inplace": (f"in place (areal's bucketed broadcast, {wt.bucket_mb} MiB buckets, "
                           "through the engine's weight loaders; staged behind generation at TP 1 "
                           "where the GPU has room)"),
               "reload": "layer-wise reload (vLLM nccl transfer in checkpoint format)",
               "auto": "inplace or reload"}[cfg.engine.weight_update]
        lines = [f"engine.weight_update={cfg.engine.weight_update}: {how}; {why}",
                 f"one NCCL group of {group_size(w, tp)} ranks: trainer rank 0 + {w} vLLM "
                 f"worker(s) × {tp} GPU rank(s)"]
        lines += [f"  rollout-{i}: "
                  + (f"ranks {rank_offset(i, tp)}..{rank_offset(i, tp) + tp - 1}" if tp > 1
                                        else f"rank {rank_offset(i, tp)}") for i in range(w)]
        return lines

    def check_shared_gpu(self, gpu: int) -> None:
        raise ValueError(f"engine=vllm cannot share GPU {gpu} with trainer rank 0: vLLM receives "
                         "weights over NCCL only. Use engine=hf on one GPU, or give the trainer a "
                         "GPU of its own (e.g. cluster.gpus=[0,1])")

    def shared_card(self, cfg: RootConfig, card: int) -> int:
        return int(card * (1 - cfg.engine.gpu_memory_utilization))


SPEC = VLLMSpec("vllm", loads_model=True, tensor_parallel=True, fp32_logits=True, merges_lora=True,
                gpu_only=True,
                lora_apply="each vLLM worker loads it through vLLM's LoRA API (a LoRARequest of a "
                           "tmpfs directory, load_inplace)",
                package="vllm", install="pip install 'areal-cli[vllm]' (GPU machines only)")

"""Weights to vLLM engines through vLLM's own NCCL weight transfer (engine=vllm).

Trainer rank 0 is rank 0 of a group of its own (vLLM's ``StatelessProcessGroup`` +
``PyNcclCommunicator``, rendezvous on ``weights_host:weights_port``, which rank 0 hosts);
rollout worker i's engine ranks follow at ``1 + i · tensor_parallel_size``. Both ends derive
the same list of names, dtypes and shapes from the model's config (tied weights once), so
only packed tensor bytes cross the wire. The engine loads them with vLLM's layer-wise
reload (``start_weight_update`` → ``update_weights`` → ``finish_weight_update``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from areal_cli.transport.weights import clean_name


@dataclass
class WireSpec:
    names: list[str]  # Hugging Face parameter names, in the order they are sent
    dtype_names: list[str]  # torch dtype names on the wire ("bfloat16")
    shapes: list[list[int]]  # each tensor's shape

    def update_info(self) -> dict:
        return dict(names=self.names, dtype_names=self.dtype_names, shapes=self.shapes, packed=True)


def wire_spec(model_path, dtype: torch.dtype) -> WireSpec:
    """Names and shapes of the parameters that travel, from the config alone (meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names, shapes = [], []
    for name, p in model.named_parameters():
        names.append(clean_name(name))
        shapes.append(list(p.shape))
    return WireSpec(names, [str(dtype).removeprefix("torch.")] * len(names), shapes)


def group_size(workers: int, tensor_parallel_size: int) -> int:
    return 1 + workers * tensor_parallel_size


class VLLMWeightSender:
    """Trainer rank 0's end; ``send`` takes (name, full tensor) pairs of every parameter."""

    def __init__(self, host: str, port: int, world_size: int, wire_dtype: torch.dtype):
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        self.engine, self.wire_dtype = NCCLWeightTransferEngine, wire_dtype
        self.group = NCCLWeightTransferEngine.trainer_init(
            dict(master_address=host, master_port=port, world_size=world_size))

    def send(self, named: Iterator[tuple[str, torch.Tensor]], digest: bool = False) -> dict:
        """Gather every full tensor first (the iterator may be a collective over the trainer's
        ranks), then broadcast them packed; returns timings."""
        t0 = time.perf_counter()
        tensors = [(clean_name(n), t.detach().to(self.wire_dtype).contiguous()) for n, t in named]
        gathered = time.perf_counter()
        self.engine.trainer_send_weights(iter(tensors), dict(group=self.group, packed=True))
        torch.cuda.synchronize()
        end = time.perf_counter()
        return {"weight_gather_s": gathered - t0, "weight_transfer_s": end - gathered, "weight_sync_s": end - t0}


class VLLMWeightReceiver:
    """A rollout worker's end: joins the group through the engine, loads each update."""

    def __init__(self, llm, spec: WireSpec, host: str, port: int, rank_offset: int, world_size: int):
        self.llm, self.spec = llm, spec
        llm.init_weight_transfer_engine(dict(init_info=dict(
            master_address=host, master_port=port, rank_offset=rank_offset, world_size=world_size)))

    def receive(self) -> dict:
        t0 = time.perf_counter()
        self.llm.start_weight_update()
        self.llm.update_weights(dict(update_info=self.spec.update_info()))
        received = time.perf_counter()
        self.llm.finish_weight_update()
        end = time.perf_counter()
        return {"weight_recv_s": received - t0, "weight_load_s": end - received}

    def digest(self) -> str:
        return ""  # the weights live inside vLLM's worker processes

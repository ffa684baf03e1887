"""Weights to vLLM engines (engine=vllm), two ways (``engine.weight_update``):

* ``inplace``: areal's bucketed broadcast (``transport/weights.py``'s ``WeightSender``, the same
  path as the hf engine's) into the engine's live parameters through its own weight loaders, staged
  behind generation at TP 1 where the GPU has room (``inplace.py``). Any tensor parallel size: every
  GPU rank of a worker receives every bucket and its loaders keep its slice.
  Llama/Mistral/Qwen2/Qwen3 layouts and the MoE ones (Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral: their
  experts through vLLM's FusedMoE loaders, ``experts.py``).
* ``reload``: vLLM's own ``nccl`` weight transfer, checkpoint-format tensors, packed; the engine
  loads them with its layer-wise reload (``start_weight_update`` → ``update_weights`` →
  ``finish_weight_update``). Works for any model vLLM loads; the fallback.

Either way trainer rank 0 is rank 0 of a group of its own and rollout worker i's GPU ranks follow at
``1 + i · tensor_parallel_size`` (``rank_offset``; each TP rank adds its own), so one broadcast
reaches every GPU of every worker. Both ends derive the same list of names and shapes from the
model's config (tied weights once), so only tensor bytes cross the wire.

The trainer casts the update into wire buffers (``prepare``) before the workers are told
(``weights.staged``: a resident copy of the weights in the wire dtype on trainer rank 0, 15 GB at
7B); unstaged, ``broadcast`` gathers and casts bucket k+1 (reload: parameter by parameter) while
bucket k is on the wire. The full-precision parameters are gathered one at a time, never all at
once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from areal_cli.transport.weights import WeightSenderBase, clean_name

log = logging.getLogger(__name__)


@dataclass
class WireSpec:
    names: list[str]  # Hugging Face parameter names, in the order they are sent
    dtype_names: list[str]  # torch dtype names on the wire ("bfloat16")
    shapes: list[list[int]]  # each tensor's shape

    def update_info(self) -> dict:
        return dict(names=self.names, dtype_names=self.dtype_names, shapes=self.shapes, packed=True)


# architectures whose vLLM implementation fuses exactly q/k/v into qkv_proj and gate/up into
# gate_up_proj and keeps every other checkpoint name (what ``inplace.route`` assumes); the MoE ones
# hold their experts in FusedMoE parameters (``experts.expert_route``)
INPLACE_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                         "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM",
                         "OlmoeForCausalLM", "MixtralForCausalLM"}


def choose_weight_update(mode: str, model_path, tensor_parallel_size: int) -> tuple[str, str]:
    """engine.weight_update resolved, and why: "auto" = inplace for the architectures above (any
    tensor_parallel_size: each TP rank's weight loaders keep its slice), else reload."""
    if mode != "auto":
        return mode, "set by engine.weight_update"
    from transformers import AutoConfig

    archs = set(AutoConfig.from_pretrained(model_path).architectures or [])
    if archs & INPLACE_ARCHITECTURES:
        return "inplace", (f"{', '.join(sorted(archs))} at "
                           f"tensor_parallel_size={tensor_parallel_size}")
    return "reload", f"architectures {sorted(archs)}: no known fused layout for in-place updates"


def wire_tensors(named: Iterator[tuple[str, torch.Tensor]],
                 plan: list[tuple[str, list[str], list[int]]],
                 wire_dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, wire-dtype tensor) for each entry of ``plan`` (``transfer_plan``), each cast as it
    comes from ``named``, so the full-precision update is never held whole."""
    known = {target for target, _, _ in plan}
    for name, tensor in named:
        key = clean_name(name)
        if key not in known:
            raise RuntimeError(f"weight {name} is not in the transfer plan (the plan is built from "
                               "the model's parameters at start: a parameter added later cannot "
                               "travel)")
        yield key, tensor.detach().to(wire_dtype)


def transfer_plan(specs: list[tuple[str, list[int]]]) -> list[tuple[str, list[str], list[int]]]:
    """``wire_tensors``' plan for the (name, shape) pairs of the trainer's parameters: each
    checkpoint tensor as itself."""
    return [(clean_name(n), [clean_name(n)], list(s)) for n, s in specs]


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
    """Ranks of the weight group: trainer rank 0 + every GPU rank of every vLLM worker."""
    return 1 + workers * tensor_parallel_size


def rank_offset(index: int, tensor_parallel_size: int) -> int:
    """Rank of rollout worker ``index``'s first GPU in the weight group; vLLM adds each TP rank to
    it."""
    return 1 + index * tensor_parallel_size


class VLLMWeightSender(WeightSenderBase):
    """Trainer rank 0's end of vLLM's own transfer (reload): ``prepare`` takes (name, full tensor)
    pairs of every parameter and, ``staged``, casts them into wire buffers kept between updates;
    ``broadcast`` sends them (unstaged: gathers, casts and sends each in turn). ``specs``: (name,
    shape) of every parameter, in the order ``prepare`` receives them."""

    def __init__(self, host: str, port: int, world_size: int, wire_dtype: torch.dtype,
                 specs: list[tuple[str, list[int]]] | None = None, staged: bool = True):
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        self.wire_dtype, self.staged, self.specs = wire_dtype, staged, specs
        self.engine = NCCLWeightTransferEngine
        self.group = self.engine.trainer_init(dict(master_address=host, master_port=port,
                                                   world_size=world_size))
        self._buffers: dict[str, torch.Tensor] = {}  # name → wire tensor
        self._named: Iterator | None = None

    def _stream(self, named: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str,
                                                                                   torch.Tensor]]:
        """Each parameter in the wire dtype as it comes from ``named``."""
        # no specs given: the names and shapes of this update (gathered at once)
        if self.specs is None:
            pairs = list(named)
            self.specs = [(n, list(t.shape)) for n, t in pairs]
            named = iter(pairs)
        return wire_tensors(named, transfer_plan(self.specs), self.wire_dtype)

    def prepare(self, named: Iterator[tuple[str, torch.Tensor]]) -> dict:
        if not self.staged:
            self._named = named  # broadcast gathers (every trainer rank takes part meanwhile)
            return {}
        t0 = time.perf_counter()
        for target, tensor in self._stream(named):
            buf = self._buffers.get(target)
            if buf is None:
                buf = self._buffers[target] = torch.empty_like(tensor)
            buf.copy_(tensor)
        torch.cuda.synchronize()
        return {"weight_gather_s": time.perf_counter() - t0}

    def broadcast(self, digest: bool = False) -> dict:
        t0 = time.perf_counter()
        if self.staged:
            tensors = iter(self._buffers.items())
        else:
            if self._named is None:
                raise RuntimeError("broadcast before prepare: nothing to send")
            tensors, self._named = self._stream(self._named), None
        self.engine.trainer_send_weights(tensors, dict(group=self.group, packed=True))
        torch.cuda.synchronize()
        return {"weight_transfer_s": time.perf_counter() - t0}

    def close(self) -> None:
        self._buffers.clear()
        self._named = None
        self.group = None


class VLLMWeightReceiver:
    """A rollout worker's end of vLLM's own transfer (reload): joins the group through the engine,
    loads each update with the engine's layer-wise reload, paused."""

    background = False

    def __init__(self, llm, spec: WireSpec, host: str, port: int, rank_offset: int,
                 world_size: int):
        self.llm, self.update_info = llm, spec.update_info()
        log.info("weight updates: layer-wise reload (vLLM's nccl transfer, checkpoint format); "
                 "this worker's GPU ranks start at %d of a %d-rank NCCL "
                 "group", rank_offset, world_size)
        llm.init_weight_transfer_engine(dict(init_info=dict(
            master_address=host, master_port=port, rank_offset=rank_offset, world_size=world_size)))

    def receive(self, version: int = -1) -> dict:
        t0 = time.perf_counter()
        self.llm.start_weight_update()
        self.llm.update_weights(dict(update_info=self.update_info))
        received = time.perf_counter()
        self.llm.finish_weight_update()
        end = time.perf_counter()
        return {"weight_recv_s": received - t0, "weight_load_s": end - received}

    def digest(self) -> str:
        return ""  # the weights live inside vLLM's worker processes

    def close(self) -> None:
        import shutil

        # the group lives inside vLLM's workers, which the engine shuts down
        shutil.rmtree(self.dir, ignore_errors=True)


class InplaceReceiver:
    """A rollout worker's end of in-place updates (``inplace.py``), driving ``InplaceWorker`` in
    every GPU worker of the engine. ``background``: staged, so the engine generates between
    ``begin`` and
    ``apply``; otherwise ``apply`` receives (the engine pauses for the wire)."""

    def __init__(self, llm, spec: WireSpec, plan: dict):
        import tempfile

        from areal_cli.engines.vllm.inplace import InplaceWorker

        self.llm, self.worker = llm, InplaceWorker
        self.reports_change = True  # apply's timings say whether the update changed the weights
        # each GPU rank's receiving thread writes how many receives it finished to <signal>.<rank>:
        # ``done`` reads those files instead of calling into the engine's loop
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = tempfile.mkdtemp(prefix="areal-weights-", dir=shm)
        self.begun = 0
        specs = [[n, s] for n, s in zip(spec.names, spec.shapes, strict=True)]
        joined = self._call(InplaceWorker.areal_weights_join,
                            plan=dict(plan, signal=os.path.join(self.dir, "received"), specs=specs))
        self.signals = [os.path.join(self.dir, f"received.{j['rank']}") for j in joined]
        self.background = all(j["staged"] for j in joined)
        log.info("weight updates: in place through areal's bucketed broadcast into the engine's "
                 "parameters, %s (%s); GPU ranks %s of a %d-rank "
                 "group", "staged behind generation, paused only for the swap"
                 if self.background else "received during the pause", joined[0]["why"],
                 [j["rank"] for j in joined], plan["world_size"])

    def _call(self, method, **kw) -> list:
        return self.llm.collective_rpc(method.__name__, kwargs=kw)

    def begin(self) -> None:
        self._call(self.worker.areal_weights_begin)
        self.begun += 1

    def done(self) -> bool:
        from areal_cli.engines.vllm.inplace import receives_finished

        return all(receives_finished(p) >= self.begun for p in self.signals)

    def apply(self) -> dict:
        """The update in the live parameters of every GPU rank; the slowest rank's timings."""
        got = self._call(self.worker.areal_weights_apply)
        return {k: max(g[k] for g in got) for k in got[0]}

    def receive(self, version: int = -1) -> dict:
        self.begin()
        return self.apply()

    def digest(self) -> str:
        return ""  # the weights live inside vLLM's worker processes

    def close(self) -> None:
        import shutil

        # the group lives inside vLLM's workers, which the engine shuts down
        shutil.rmtree(self.dir, ignore_errors=True)

"""Weights to vLLM engines through vLLM's own NCCL weight transfer (engine=vllm).

Trainer rank 0 is rank 0 of a group of its own (vLLM's ``StatelessProcessGroup`` +
``PyNcclCommunicator``, rendezvous on ``weights_host:weights_port``, which rank 0 hosts);
rollout worker i's engine ranks follow at ``1 + i · tensor_parallel_size`` (``rank_offset``; vLLM
adds its TP rank), so one broadcast reaches every GPU of every worker: at TP > 1 each GPU rank
receives the full checkpoint tensors and its layer-wise reload keeps its own shard. Both ends derive
the same list of names, dtypes and shapes from the model's config (tied weights once), so
only tensor bytes cross the wire. Two ways to load (``engine.weight_update``):

* ``reload``: vLLM's ``nccl`` backend, checkpoint-format tensors, packed; the engine loads
  them with its layer-wise reload (``start_weight_update`` → ``update_weights`` →
  ``finish_weight_update``). Works for any model vLLM loads.
* ``inplace``: vLLM's ``sparse_nccl`` backend with dense patches (every index) in the
  engine's own layout — q/k/v fused into ``qkv_proj``, gate/up into ``gate_up_proj`` — copied
  straight into the live parameters: no reload, so the pause is mostly the wire. vLLM 0.26
  supports it at tensor_parallel_size 1 only (its patches index the unsharded parameter).

The trainer casts the update into wire buffers (``prepare``) before the workers pause
(``weights.staged``: a resident copy of the weights in the wire dtype on trainer rank 0, 15 GB at
7B); unstaged, ``broadcast`` gathers each parameter from the shards, casts it and hands it to the
engine one at a time (no resident copy; the gather falls inside the workers' pause). Either way the
full-precision parameters are gathered one at a time (``wire_tensors``), never all at once.
"""

from __future__ import annotations

import logging
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

    def inplace(self) -> WireSpec:
        """The same parameters in the engine's fused layout (see ``fused_plan``)."""
        plan = fused_plan(self.names, self.shapes)
        return WireSpec([n for n, _, _ in plan], [self.dtype_names[0]] * len(plan), [s for _, _, s in plan])

    def inplace_update_info(self) -> dict:
        fused = self.inplace()
        numels = [int(torch.Size(s).numel()) for s in fused.shapes]
        return dict(names=fused.names, dtype_names=fused.dtype_names, shapes=fused.shapes, num_updates_list=numels)


# architectures whose vLLM implementation fuses exactly q/k/v into qkv_proj and gate/up into
# gate_up_proj and keeps every other checkpoint name (what ``fused_plan`` assumes)
INPLACE_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}


def choose_weight_update(mode: str, model_path, tensor_parallel_size: int) -> tuple[str, str]:
    """engine.weight_update resolved, and why: "auto" = inplace for the architectures above at TP 1,
    else reload (vLLM 0.26's sparse_nccl engine refuses a world size > 1 in start_weight_update)."""
    if mode != "auto":
        return mode, "set by engine.weight_update"
    if tensor_parallel_size != 1:
        return "reload", (f"tensor_parallel_size={tensor_parallel_size}: vLLM's in-place (sparse_nccl) "
                          "transfer supports TP=1 only")
    from transformers import AutoConfig

    archs = set(AutoConfig.from_pretrained(model_path).architectures or [])
    if archs & INPLACE_ARCHITECTURES:
        return "inplace", f"{', '.join(sorted(archs))} at tensor_parallel_size=1"
    return "reload", f"architectures {sorted(archs)}: no known fused layout for in-place updates"


FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
         "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def fused_plan(names: list[str], shapes: list[list[int]]) -> list[tuple[str, list[str], list[int]]]:
    """(engine parameter, its checkpoint parameters in order, fused shape) for every engine
    parameter, in the order of first appearance: ``x.q_proj.weight`` + ``x.k_proj.weight`` +
    ``x.v_proj.weight`` → ``x.qkv_proj.weight`` (rows concatenated), gate/up likewise."""
    groups: dict[str, list[tuple[int, str, list[int]]]] = {}
    for name, shape in zip(names, shapes, strict=True):
        *prefix, module, leaf = name.split(".")
        target, slot = FUSED.get(module, (module, 0))
        groups.setdefault(".".join([*prefix, target, leaf]), []).append((slot, name, list(shape)))
    plan = []
    for target, members in groups.items():
        members.sort()
        if any(slot != i for i, (slot, _, _) in enumerate(members)):
            raise ValueError(f"engine.weight_update=inplace: {target} misses a fused part "
                             f"(has {[n for _, n, _ in members]}); use engine.weight_update=reload")
        shape = list(members[0][2])
        shape[0] = sum(m[2][0] for m in members)
        plan.append((target, [n for _, n, _ in members], shape))
    return plan


def wire_tensors(named: Iterator[tuple[str, torch.Tensor]], plan: list[tuple[str, list[str], list[int]]],
                 wire_dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(engine parameter, wire-dtype tensor) for each entry of ``plan`` (``fused_plan``, or one
    part per parameter), yielded as soon as its parts have come from ``named``: each part is cast
    as it arrives and only the parts of unfinished fused parameters (one layer's q/k/v or
    gate/up) wait, so the full-precision update is never held whole."""
    owner = {part: (target, parts) for target, parts, _ in plan for part in parts}
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        key = clean_name(name)
        if key not in owner:
            raise RuntimeError(f"weight {name} is not in the transfer plan (the plan is built from the model's "
                               "parameters at start: a parameter added later cannot travel)")
        target, parts = owner[key]
        got = pending.setdefault(target, {})
        got[key] = tensor.detach().to(wire_dtype)
        if len(got) == len(parts):
            del pending[target]
            yield target, got[key] if len(parts) == 1 else torch.cat([got[p] for p in parts])
    if pending:
        raise RuntimeError(f"the update ended with parts missing for {sorted(pending)}")


def transfer_plan(specs: list[tuple[str, list[int]]], fused: bool) -> list[tuple[str, list[str], list[int]]]:
    """``wire_tensors``' plan for the (name, shape) pairs of the trainer's parameters: the engine's
    fused layout (``inplace``) or each checkpoint tensor as itself (``reload``)."""
    names, shapes = [clean_name(n) for n, _ in specs], [list(s) for _, s in specs]
    if fused:
        return fused_plan(names, shapes)
    return [(n, [n], s) for n, s in zip(names, shapes, strict=True)]


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
    """Rank of rollout worker ``index``'s first GPU in the weight group; vLLM adds each TP rank to it."""
    return 1 + index * tensor_parallel_size


class VLLMWeightSender(WeightSenderBase):
    """Trainer rank 0's end: ``prepare`` takes (name, full tensor) pairs of every parameter and,
    ``staged``, casts them into wire buffers kept between updates; ``broadcast`` sends them
    (unstaged: gathers, casts and sends each in turn). ``specs``: (name, shape) of every
    parameter, in the order ``prepare`` receives them."""

    def __init__(self, host: str, port: int, world_size: int, wire_dtype: torch.dtype, mode: str = "reload",
                 specs: list[tuple[str, list[int]]] | None = None, staged: bool = True):
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        self.wire_dtype, self.mode, self.staged = wire_dtype, mode, staged
        self.specs = specs
        if mode == "inplace":
            from vllm.distributed.weight_transfer.sparse_nccl_engine import (
                SparseNCCLWeightTransferEngine,
            )

            self.engine = SparseNCCLWeightTransferEngine
        else:
            self.engine = NCCLWeightTransferEngine
        self.group = self.engine.trainer_init(dict(master_address=host, master_port=port, world_size=world_size))
        self._buffers: dict[str, torch.Tensor] = {}  # name → wire tensor (checkpoint or fused layout)
        self._indices: dict[int, torch.Tensor] = {}  # numel → arange (inplace patches cover every index)
        self._named: Iterator | None = None

    def _stream(self, named: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Each engine parameter in the wire dtype as its parts come from ``named``."""
        if self.specs is None:  # no specs given: the names and shapes of this update (gathered at once)
            pairs = list(named)
            self.specs = [(n, list(t.shape)) for n, t in pairs]
            named = iter(pairs)
        return wire_tensors(named, transfer_plan(self.specs, self.mode == "inplace"), self.wire_dtype)

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

    def _patches(self, tensors: Iterator[tuple[str, torch.Tensor]]):
        """inplace: a dense patch (every index) of each engine parameter; staged, the index ranges
        are kept between updates, unstaged each is made and dropped with its patch."""
        from vllm.distributed.weight_transfer.sparse_nccl_engine import SparseWeightPatch

        for name, tensor in tensors:
            flat = tensor.view(-1)
            idx = self._indices.get(flat.numel())
            if idx is None:
                idx = torch.arange(flat.numel(), dtype=torch.int32, device=flat.device)
                if self.staged:
                    self._indices[flat.numel()] = idx
            yield SparseWeightPatch(name, idx, flat)

    def broadcast(self, digest: bool = False) -> dict:
        t0 = time.perf_counter()
        if self.staged:
            tensors = iter(self._buffers.items())
        else:
            if self._named is None:
                raise RuntimeError("broadcast before prepare: nothing to send")
            tensors, self._named = self._stream(self._named), None
        if self.mode == "inplace":
            self.engine.trainer_send_weights(self._patches(tensors), dict(group=self.group, packed=False))
        else:
            self.engine.trainer_send_weights(tensors, dict(group=self.group, packed=True))
        torch.cuda.synchronize()
        return {"weight_transfer_s": time.perf_counter() - t0}

    def close(self) -> None:
        self._buffers.clear()
        self._indices.clear()
        self._named = None
        self.group = None


class VLLMWeightReceiver:
    """A rollout worker's end: joins the group through the engine, loads each update."""

    def __init__(self, llm, spec: WireSpec, host: str, port: int, rank_offset: int, world_size: int,
                 mode: str = "reload"):
        self.llm, self.spec, self.mode = llm, spec, mode
        self.update_info = spec.inplace_update_info() if mode == "inplace" else spec.update_info()
        log.info("weight updates: %s; this worker's GPU ranks start at %d of a %d-rank NCCL group", {
            "inplace": "in place (sparse_nccl, into the fused parameters)",
            "reload": "layer-wise reload (nccl, checkpoint format)"}.get(mode, mode), rank_offset, world_size)
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
        pass  # the group lives inside vLLM's workers, which the engine shuts down

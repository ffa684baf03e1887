"""The weight broadcast group: trainer rank 0 → every rollout worker, in buckets.

A process group of its own (gloo on CPU, NCCL on GPU), built from a TCPStore hosted by
trainer rank 0 — independent of torchrun's group, so rollout workers never join the
trainer's collectives. Rank 0 is the trainer, rank 1+i is rollout worker i. Both sides
derive the same bucket plan from the model's parameter names and shapes, so only raw
tensor bytes cross the wire. The sender gathers bucket k+1 while bucket k is on the wire;
the receiver loads each bucket as it arrives.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class ParamSpec:
    name: str
    shape: tuple
    numel: int


def param_specs(model: torch.nn.Module) -> list[ParamSpec]:
    """The parameters that travel, in a stable order (tied weights once)."""
    out = []
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        out.append(ParamSpec(clean_name(name), shape, int(torch.Size(shape).numel())))
    return out


def clean_name(name: str) -> str:
    """Strip wrapper prefixes (activation checkpointing, torch.compile) from a parameter name."""
    for junk in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."):
        name = name.replace(junk, "")
    return name


def plan_buckets(specs: list[ParamSpec], bucket_bytes: int, elem_bytes: int) -> list[list[ParamSpec]]:
    buckets, cur, size = [], [], 0
    for s in specs:
        if cur and size + s.numel * elem_bytes > bucket_bytes:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(s)
        size += s.numel * elem_bytes
    if cur:
        buckets.append(cur)
    return buckets


def new_group(host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float):
    """A standalone process group (no init_process_group); rank 0 hosts the TCPStore."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout,
                          wait_for_workers=False)
    prefixed = dist.PrefixStore("areal-weights", store)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    else:
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    return store, pg


def _broadcast(pg, tensor: torch.Tensor):
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return pg.broadcast([tensor], opts)


class WeightSender:
    """Trainer rank 0's end. ``send`` takes (name, full tensor) pairs in plan order."""

    def __init__(self, specs, host, port, world_size, backend, device, wire_dtype, bucket_bytes,
                 timeout_s=600.0):
        self.device, self.wire_dtype = device, wire_dtype
        self.buckets = plan_buckets(specs, bucket_bytes, torch.tensor([], dtype=wire_dtype).element_size())
        self.store, self.pg = new_group(host, port, 0, world_size, backend, timeout_s)

    def send(self, named: Iterator[tuple[str, torch.Tensor]], digest: bool = False) -> dict:
        """Broadcast every bucket; returns timings (gather / transfer) and an optional sha256."""
        t0, gather, sha = time.perf_counter(), 0.0, hashlib.sha256() if digest else None
        pending = None
        for bucket in self.buckets:
            g0 = time.perf_counter()
            parts = []
            for spec in bucket:
                name, tensor = next(named)
                assert clean_name(name) == spec.name, f"weight order differs: {name} vs {spec.name}"
                parts.append(tensor.detach().to(self.device, self.wire_dtype).reshape(-1))
            flat = torch.cat(parts)
            gather += time.perf_counter() - g0
            if sha is not None:
                sha.update(flat.cpu().view(torch.uint8).numpy().tobytes())
            if pending is not None:
                pending.wait()
            pending = _broadcast(self.pg, flat)
        if pending is not None:
            pending.wait()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        total = time.perf_counter() - t0
        out = {"weight_gather_s": gather, "weight_transfer_s": total - gather, "weight_sync_s": total}
        if sha is not None:
            out["weights_sha"] = sha.hexdigest()
        return out


class WeightReceiver:
    """A rollout worker's end: receives each bucket and copies it into the model in place."""

    def __init__(self, model: torch.nn.Module, host, port, rank, world_size, backend, wire_dtype,
                 bucket_bytes, timeout_s=600.0):
        self.model, self.wire_dtype = model, wire_dtype
        self.params = {clean_name(n): p for n, p in model.named_parameters()}
        self.device = next(model.parameters()).device
        specs = param_specs(model)
        self.buckets = plan_buckets(specs, bucket_bytes, torch.tensor([], dtype=wire_dtype).element_size())
        self.store, self.pg = new_group(host, port, rank, world_size, backend, timeout_s)

    @torch.no_grad()
    def receive(self) -> dict:
        t0, load = time.perf_counter(), 0.0
        for bucket in self.buckets:
            flat = torch.empty(sum(s.numel for s in bucket), dtype=self.wire_dtype, device=self.device)
            _broadcast(self.pg, flat).wait()
            l0 = time.perf_counter()
            offset = 0
            for spec in bucket:
                self.params[spec.name].copy_(flat[offset:offset + spec.numel].view(spec.shape))
                offset += spec.numel
            load += time.perf_counter() - l0
        return {"weight_recv_s": time.perf_counter() - t0, "weight_load_s": load}

    def digest(self) -> str:
        sha = hashlib.sha256()
        for bucket in self.buckets:
            for spec in bucket:
                t = self.params[spec.name].detach().to(self.wire_dtype).reshape(-1).cpu()
                sha.update(t.view(torch.uint8).numpy().tobytes())
        return sha.hexdigest()

"""The weight broadcast group: trainer rank 0 → every rollout worker, in buckets.

A process group of its own (gloo on CPU, NCCL on GPU), built from a TCPStore hosted by
trainer rank 0 — independent of torchrun's group, so rollout workers never join the
trainer's collectives. Rank 0 is the trainer, rank 1+i is rollout worker i. Both sides
derive the same bucket plan from the model's parameter names and shapes, so only raw
tensor bytes cross the wire. The sender casts the whole update into wire buffers before the
workers pause; the receiver loads each bucket as it arrives, while the next is on the wire.
"""

from __future__ import annotations

import hashlib
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from areal_cli.transport.channels import is_loopback


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


def plan_buckets(specs: list[ParamSpec], bucket_bytes: int,
                 elem_bytes: int) -> list[list[ParamSpec]]:
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


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host`` only (what ``host`` resolves to), for a TCPStore server.

    ``TCPStore(host, port, is_master=True)`` ignores ``host`` when it listens: it binds every
    interface (torch 2.13, libuv and legacy backends alike). Handing it a socket bound here
    through ``master_listen_fd`` is the one way torch offers to bind one address."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as err:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} ({err.strerror}): set launcher.port_base to "
                      "a free range, or launcher.port_base=0 to let the OS choose") from None
    sock.listen(128)
    return sock


def bound_store(host: str, port: int, world_size: int | None, timeout: timedelta,
                **kw) -> dist.TCPStore:
    """A TCPStore server that listens on ``host`` only; the store owns the socket from here on."""
    sock = listen_socket(host, port)
    return dist.TCPStore(host, sock.getsockname()[1], world_size, is_master=True, timeout=timeout,
                         master_listen_fd=sock.detach(), **kw)


def new_group(host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float,
              store_path: str = "", high_priority: bool = False):
    """A standalone process group (no init_process_group). Its store is ``store_path``, a FileStore
    inside the run directory (0700: only the run's user and root can read or write a key), or,
    without one (Slurm, across nodes), a TCPStore rank 0 hosts on ``host`` only. ``high_priority``:
    NCCL's collectives on streams of the highest priority (``weights.high_priority``)."""
    timeout = timedelta(seconds=timeout_s)
    if store_path:
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(timeout)
    elif rank == 0:
        store = bound_store(host, port, world_size, timeout, wait_for_workers=False)
    else:
        store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    prefixed = dist.PrefixStore("areal-weights", store)
    if backend == "ipc":
        from areal_cli.transport.cuda_ipc import ipc_group

        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [gloo_device(host, rank)]
        pg = ipc_group(prefixed, rank, world_size, opts)
    elif backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        opts.is_high_priority_stream = high_priority
        pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    else:
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [gloo_device(host, rank)]
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size, opts)
    return store, pg


def on_device(backend: str) -> bool:
    """Whether ``backend`` moves tensors in GPU memory (nccl, ipc); gloo's are in host memory."""
    return str(backend) in ("nccl", "ipc")


def gloo_device(host: str, rank: int):
    """Gloo's transport listens for its peers too: rank 0 on the store's ``host``, and every rank
    on it when it is a loopback address (one machine); others where their hostname resolves."""
    if rank == 0 or is_loopback(host):
        return dist.ProcessGroupGloo.create_device(hostname=host)
    return dist.ProcessGroupGloo.create_default_device()


def _broadcast(pg, tensor: torch.Tensor):
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return pg.broadcast([tensor], opts)


def _views(flat: torch.Tensor, bucket: list[ParamSpec]) -> list[torch.Tensor]:
    out, offset = [], 0
    for spec in bucket:
        out.append(flat[offset:offset + spec.numel].view(spec.shape))
        offset += spec.numel
    return out


def _copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """dst[i] ← src[i] (with a cast): fused multi-tensor copies on one GPU (on the CPU the
    fused op is several times slower than a loop)."""
    if dst and dst[0].is_cuda and all(d.device == s.device for d, s in zip(dst, src, strict=True)):
        torch._foreach_copy_(dst, src)
    else:
        for d, s in zip(dst, src, strict=True):
            d.copy_(s)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class WeightSenderBase(ABC):
    """Trainer rank 0's end of a weight transfer to every rollout worker, whatever carries it (this
    module's bucketed broadcast, or vLLM's own NCCL transfer in engines/vllm/weights.py). Built
    through
    ``engines.factory.make_sender``, which picks the one the run's engine receives."""

    @abstractmethod
    def prepare(self, named: Iterator[tuple[str, torch.Tensor]]) -> dict:
        """Take every (name, full tensor) pair of the update into the sender's wire buffers, before
        the rollout workers pause; returns timings (``weight_gather_s``)."""

    @abstractmethod
    def broadcast(self, digest: bool = False) -> dict:
        """Put the prepared update on the wire to every worker; returns timings
        (``weight_transfer_s``, and ``weights_sha`` where ``digest`` asks for it and the sender can
        compute one)."""

    @abstractmethod
    def close(self) -> None:
        """Free the wire buffers and leave the group."""


class WeightSender(WeightSenderBase):
    """Trainer rank 0's end of the bucketed broadcast.

    ``prepare(named)`` casts every (name, full tensor) pair, in plan order, into wire buffers
    that live as long as the sender; ``broadcast()`` then puts every bucket on the wire back to
    back. The trainer prepares *before* it tells the rollout workers to pause, so the pause
    they see is the wire plus their own load, not the trainer's gather. With ``staged=False``
    only two bucket buffers exist and ``broadcast`` gathers bucket k+1 while bucket k is on the
    wire (less memory, longer pause). With the ipc backend (the trainer and a rollout worker share
    the GPU, where NCCL refuses two ranks) the buffers stay on the GPU and each bucket is one device
    copy into the worker's (``cuda_ipc.py``); with gloo they are in host memory.
    """

    def __init__(self, specs, host, port, world_size, backend, device, wire_dtype, bucket_bytes,
                 timeout_s=600.0, staged=True, store_path="", high_priority=False):
        self.device, self.wire_dtype, self.staged = device, wire_dtype, staged
        self.buffer_device = device if on_device(backend) else torch.device("cpu")
        self.buckets = plan_buckets(specs, bucket_bytes,
                                    torch.tensor([], dtype=wire_dtype).element_size())
        self.sizes = [sum(s.numel for s in b) for b in self.buckets]
        self.store, self.pg = new_group(host, port, 0, world_size, backend, timeout_s, store_path,
                                        high_priority)
        # buffer slot → wire buffer, allocated on first use
        self._flats: dict[int, torch.Tensor] = {}
        self._named: Iterator | None = None

    def _flat(self, k: int) -> torch.Tensor:
        """Bucket k's wire buffer: its own when staged, else one of two shared slots."""
        slot = k if self.staged else k % 2
        if slot not in self._flats:
            n = self.sizes[k] if self.staged else max(self.sizes)
            self._flats[slot] = torch.empty(n, dtype=self.wire_dtype, device=self.buffer_device)
        return self._flats[slot][:self.sizes[k]]

    def _gather(self, k: int, named: Iterator) -> torch.Tensor:
        bucket = self.buckets[k]
        srcs = []
        for spec in bucket:
            name, tensor = next(named)
            if clean_name(name) != spec.name:
                raise RuntimeError(f"weight order differs from the plan: {name} vs {spec.name}")
            srcs.append(tensor.detach().reshape(spec.shape))
        flat = self._flat(k)
        _copy(_views(flat, bucket), srcs)  # cast into the wire buffer
        return flat

    def prepare(self, named: Iterator[tuple[str, torch.Tensor]]) -> dict:
        """Gather the whole update into the wire buffers (staged), or keep ``named`` for
        ``broadcast`` to gather bucket by bucket; returns the gather time."""
        t0 = time.perf_counter()
        if not self.staged:
            self._named = named
            return {}
        for k in range(len(self.buckets)):
            self._gather(k, named)
        _sync(self.device)
        return {"weight_gather_s": time.perf_counter() - t0}

    def broadcast(self, digest: bool = False) -> dict:
        """Put the prepared update on the wire; returns timings and an optional sha256."""
        t0, gather, works = time.perf_counter(), 0.0, []
        sha = hashlib.sha256() if digest else None
        for k in range(len(self.buckets)):
            if self.staged:
                flat = self._flat(k)
            else:
                if len(works) >= 2:  # the buffer about to be refilled must be off the wire
                    works[-2].wait()
                g0 = time.perf_counter()
                flat = self._gather(k, self._named)
                gather += time.perf_counter() - g0
            if sha is not None:
                sha.update(flat.cpu().view(torch.uint8).numpy().tobytes())
            works.append(_broadcast(self.pg, flat))
        for w in works:
            w.wait()
        _sync(self.device)
        self._named = None
        total = time.perf_counter() - t0
        out = {"weight_transfer_s": total - gather}
        if not self.staged:
            out["weight_gather_s"] = gather
        if sha is not None:
            out["weights_sha"] = sha.hexdigest()
        return out

    def close(self) -> None:
        self._flats.clear()
        self._named = None
        self.pg = self.store = None


class WeightReceiver:
    """A rollout worker's end: receives the buckets into two buffers in turn and copies each into
    the model in place as soon as it has arrived, while the next one is on the wire (so a worker
    holds two buckets, never a second copy of the model)."""

    def __init__(self, model: torch.nn.Module | None, host, port, rank, world_size, backend,
                 wire_dtype,
                 bucket_bytes, timeout_s=600.0, targets: dict[str, torch.Tensor] | None = None,
                 store_path=""):
        """Loads into ``model``'s parameters, or into ``targets`` (name → tensor, in the sender's
        order: e.g. an engine's adapter buffers) where given; ``store_path``: the group's FileStore
        (local runs)."""
        self.model, self.wire_dtype = model, wire_dtype
        if targets is None:
            self.params = {clean_name(n): p for n, p in model.named_parameters()}
            specs = param_specs(model)
        else:
            self.params = dict(targets)
            specs = [ParamSpec(n, tuple(t.shape), t.numel()) for n, t in targets.items()]
        self.device = next(iter(self.params.values())).device
        buffer_device = self.device if on_device(backend) else torch.device("cpu")
        self.buckets = plan_buckets(specs, bucket_bytes,
                                    torch.tensor([], dtype=wire_dtype).element_size())
        self.sizes = [sum(s.numel for s in b) for b in self.buckets]
        self.slots = [torch.empty(max(self.sizes), dtype=wire_dtype, device=buffer_device)
                      for _ in range(min(2, len(self.buckets)))]
        self.targets = [[self.params[s.name] for s in b] for b in self.buckets]
        self.store, self.pg = new_group(host, port, rank, world_size, backend, timeout_s,
                                        store_path)

    def _flat(self, k: int) -> torch.Tensor:
        return self.slots[k % len(self.slots)][:self.sizes[k]]

    @torch.no_grad()
    def receive(self, version: int = -1) -> dict:
        """The next update, loaded; ``version`` (unused here) is the one the trainer sends."""
        t0, load = time.perf_counter(), 0.0
        _sync(self.device)  # nothing queued may still read the old weights
        n = len(self.buckets)
        works = {k: _broadcast(self.pg, self._flat(k)) for k in range(len(self.slots))}
        for k in range(n):
            works.pop(k).wait()
            l0 = time.perf_counter()
            _copy(self.targets[k], _views(self._flat(k), self.buckets[k]))
            load += time.perf_counter() - l0
            # this slot is free again: the bucket after next goes into it
            if k + len(self.slots) < n:
                works[k + len(self.slots)] = _broadcast(self.pg, self._flat(k + len(self.slots)))
        _sync(self.device)  # NCCL waits only order the stream: the times cover the finished copies
        return {"weight_recv_s": time.perf_counter() - t0, "weight_load_s": load}

    def close(self) -> None:
        self.slots = []
        self.pg = self.store = None

    def digest(self) -> str:
        sha = hashlib.sha256()
        for bucket in self.buckets:
            for spec in bucket:
                t = self.params[spec.name].detach().to(self.wire_dtype).reshape(-1).cpu()
                sha.update(t.view(torch.uint8).numpy().tobytes())
        return sha.hexdigest()

"""In-place weight updates of a vLLM engine through areal's bucketed broadcast
(engine.weight_update=inplace).

Trainer rank 0 sends the update exactly as it does to the hf engine (``transport/weights.py``:
checkpoint-format tensors packed into buckets of ``weights.bucket_mb``, cast into wire buffers
before the workers are told, one NCCL broadcast per bucket). On the receiving side, every GPU rank
of a vLLM worker (rank ``rank_offset + its TP rank`` in the weight group) receives every bucket and
writes each tensor through the engine's own weight loaders, which fuse q/k/v and gate/up and keep
this TP rank's slice — so any tensor parallel size loads in place, and no layer-wise reload runs.
An MoE layer's expert tensors go through its FusedMoE loader, expert by expert (``experts.py``).

Two ways to receive, chosen when the worker joins and logged:

* staged (tensor_parallel_size 1, when the GPU has room for a second copy of the weights): the
  buckets are received and loaded into a staging copy by a thread of vLLM's worker process, on a
  stream of its own, **while generation goes on**; the pause is only the swap, one fused copy of
  staging into the live parameters (BENCHMARKS.md "Weight updates"). The pause does not grow with
  the bytes moved. At TP > 1 only with ``engine.vllm.staged_tp=true``: a receiving thread's
  broadcasts then run beside the engine's own TP collectives (two NCCL communicators, in an order
  the ranks need not share), which is off until it has been measured not to hang.
* direct: the buckets are received during the pause and loaded straight into the live parameters
  (two bucket buffers; the pause is the wire plus the loads). At TP > 1 by default.

``InplaceWorker`` is mixed into vLLM's GPU worker (``worker_extension_cls``); the rollout worker
drives it through ``LLM.collective_rpc`` (``InplaceReceiver``, in ``weights.py``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import time
from collections.abc import Callable

import torch

from areal_cli.engines.vllm.experts import (
    Experts,
    check_backends,
    check_shape,
    expert_route,
    find,
    load_experts,
    moe_backends,
)
from areal_cli.transport.weights import ParamSpec, _broadcast, _views, on_device, plan_buckets

log = logging.getLogger(__name__)

# checkpoint module → (the engine's fused module, the shard id its weight loader takes)
FUSED_SHARDS = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"),
                "v_proj": ("qkv_proj", "v"),
                "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

STAGING_HEADROOM = 1 << 30
"""Bytes of the GPU left free beyond the staging copy and the two bucket buffers."""


def route(name: str) -> tuple[str, str | int | None]:
    """(the engine's parameter, shard id or None) a checkpoint tensor is loaded into:
    ``model.layers.0.self_attn.k_proj.weight`` → (``model.layers.0.self_attn.qkv_proj.weight``,
    "k")."""
    *prefix, module, leaf = name.split(".")
    if module in FUSED_SHARDS:
        target, shard = FUSED_SHARDS[module]
        return ".".join([*prefix, target, leaf]), shard
    return name, None


def routes(specs: list[ParamSpec], params: dict[str, torch.Tensor]
           ) -> dict[str, tuple[str, str | int | Experts | None]]:
    """``route`` of every checkpoint tensor (an MoE expert tensor: ``experts.expert_route``),
    checked against the engine's parameters (name → tensor): ValueError naming
    engine.weight_update=reload where a tensor has no parameter or a parameter receives nothing (a
    layout this module does not know)."""
    out: dict[str, tuple[str, str | int | Experts | None]] = {}
    for s in specs:
        hit = expert_route(s.name, params)
        if hit is not None:
            check_shape(s.name, s.shape, hit[1], params[hit[0]].shape)
            out[s.name] = hit
        else:
            target, shard = route(s.name)
            out[s.name] = (find(target, params) or target, shard)
    missing = sorted(n for n, (p, _) in out.items() if p not in params)
    fed = {p for p, _ in out.values()}
    unfed = sorted(p for p in params if p not in fed)
    if unfed == ["lm_head.weight"] and not missing:
        raise ValueError("engine.weight_update=inplace: the checkpoint ties lm_head to "
                         "embed_tokens (tie_word_embeddings) but the engine's model keeps its own "
                         "lm_head, which nothing would load; save the model with "
                         "tie_word_embeddings=false and lm_head.weight written out")
    if missing or unfed:
        raise ValueError("engine.weight_update=inplace: the engine's parameters do not match the "
                         f"checkpoint's (no engine parameter for {missing[:3]}, nothing sent to "
                         f"{unfed[:3]}); set engine.weight_update=reload")
    return out


def shadow(param: torch.nn.Parameter) -> torch.nn.Parameter:
    """A parameter of the same class and attributes (vLLM's weight loader, output_dim, TP rank...)
    over new memory holding a copy of ``param``: the engine's loaders write into it exactly as into
    ``param``, and what no loader writes (the padding rows of a vocabulary padded to a multiple of
    64) keeps the live values, so the swap carries nothing else into the engine and an update with
        the same weights
    leaves the same bytes."""
    data = param.data.clone()
    cls = type(param)
    out = torch.nn.Parameter(data,
                             requires_grad=False) if cls is torch.nn.Parameter else cls.__new__(cls,
                                                                                                data)
    out.__dict__.update(param.__dict__)
    return out


@torch.no_grad()
def fingerprint(tensors) -> torch.Tensor:
    """One int32 per tensor: the sum, wrapping at 2**32, of its bytes read as 32-bit words. Any
    change of an element changes it unless other changes cancel it exactly; the same weights give
    the same fingerprint. On the tensors' device, with no copy of them (a reduction in the input's
    own integer type makes none; a widening one would write a temporary four times the tensor's
    size)."""
    sums = []
    for t in tensors:
        raw = t.detach().reshape(-1).view(torch.uint8)
        n = raw.numel() - raw.numel() % 4
        try:
            words = raw[:n].view(torch.int32)
        except RuntimeError:  # a view whose start is not 4-byte aligned
            words = raw[:n].clone().view(torch.int32)
        total = words.sum(dtype=torch.int32)
        if n < raw.numel():
            total = total + raw[n:].to(torch.int32).sum(dtype=torch.int32)
        sums.append(total)
    return torch.stack(sums) if sums else torch.zeros(0, dtype=torch.int32)


def load_into(param: torch.nn.Parameter, tensor: torch.Tensor,
              shard: str | int | Experts | None) -> None:
    """``tensor`` written into ``param`` by the engine's weight loader for it (a plain copy where it
    has none; a FusedMoE parameter's loader once per expert and shard)."""
    loader: Callable | None = getattr(param, "weight_loader", None)
    if isinstance(shard, Experts):
        load_experts(param, tensor, shard)
    elif loader is None:
        if param.shape != tensor.shape:
            raise RuntimeError(f"weight of shape {list(tensor.shape)} for a parameter of shape "
                               f"{list(param.shape)}")
        param.data.copy_(tensor)
    elif shard is None:
        loader(param, tensor)
    else:
        loader(param, tensor, shard)


class BucketLoader:
    """Receives one update's buckets (the sender's plan of ``specs``) from ``pg`` and writes each
    tensor through ``load_into`` into ``targets`` (engine parameter name → parameter: the live ones,
    or their shadows). ``device``: where the bucket buffers live (the GPU with NCCL, the host with
    gloo)."""

    def __init__(self, specs: list[ParamSpec], targets: dict[str, torch.nn.Parameter], pg,
                 wire_dtype: torch.dtype,
                 bucket_bytes: int, device: torch.device):
        self.routes = routes(specs, targets)
        self.targets, self.pg = targets, pg
        self.buckets = plan_buckets(specs, bucket_bytes,
                                    torch.tensor([], dtype=wire_dtype).element_size())
        self.sizes = [sum(s.numel for s in b) for b in self.buckets]
        self.slots = [torch.empty(max(self.sizes), dtype=wire_dtype, device=device)
                      for _ in range(min(2, len(self.buckets)))]

    def _flat(self, k: int) -> torch.Tensor:
        return self.slots[k % len(self.slots)][:self.sizes[k]]

    @torch.no_grad()
    def receive(self) -> float:
        """Every bucket of the next update, loaded (bucket k+1 on the wire while bucket k loads; the
        loads of a slot are queued before the broadcast that refills it). Returns the load time
        (s)."""
        load, n = 0.0, len(self.buckets)
        works = {k: _broadcast(self.pg, self._flat(k)) for k in range(len(self.slots))}
        for k in range(n):
            works.pop(k).wait()
            t0 = time.perf_counter()
            for spec, view in zip(self.buckets[k], _views(self._flat(k), self.buckets[k]),
                                  strict=True):
                target, shard = self.routes[spec.name]
                load_into(self.targets[target], view, shard)
            load += time.perf_counter() - t0
            if k + len(self.slots) < n:
                works[k + len(self.slots)] = _broadcast(self.pg, self._flat(k + len(self.slots)))
        return load


class StagedUpdate:
    """One engine's staged intake: ``begin`` receives the next update into shadows of ``live`` in a
    thread (a stream of its own on a GPU) while the engine keeps generating; ``apply`` waits for it
    and copies every shadow into its live parameter at once. Without ``staged`` (no room for the
    shadows),
    ``begin`` does nothing and ``apply`` receives straight into the live parameters.

    ``apply`` also says whether the update changed the weights at all (``weights_changed``, from
    ``fingerprint`` of the received weights against the live ones before it): an update that changed
    them must change the engine's outputs, which the engine then checks (``VLLMEngine``).

    ``signal``: a file the receiving thread writes the count of receives it finished to (a failed
    one included: ``apply`` raises it), so that the rollout worker sees the wire done by reading a
    file instead of an RPC that waits for the engine's loop to take it between two steps."""

    def __init__(self, specs: list[ParamSpec], live: dict[str, torch.nn.Parameter], pg,
                 backend: str,
                 wire_dtype: torch.dtype, bucket_bytes: int, device: torch.device, staged: bool,
                 signal: str | None = None, high_priority: bool = False):
        self.live, self.device, self.staged = live, device, staged
        self.signal, self.finished = signal, 0
        self.shadows = {n: shadow(p) for n, p in live.items()} if staged else {}
        buffers = device if on_device(backend) else torch.device("cpu")
        self.loader = BucketLoader(specs, self.shadows if staged else live, pg, wire_dtype,
                                   bucket_bytes, buffers)
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="areal-weights")
        # the copies into the engine's parameters: the highest priority (-1 on current GPUs) with
        # high_priority
        self.stream = torch.cuda.Stream(device,
                                        priority=-1
                                        if high_priority else 0) if device.type == "cuda" else None
        self.pending: concurrent.futures.Future | None = None
        # of the weights the engine runs
        self.live_print = fingerprint(p.data for p in live.values())
        self.received = self.live_print  # of the last update received

    def _receive(self) -> dict:
        """The next update into the shadows (staged) or the live parameters, and its fingerprint
        (computed here: behind generation when staged)."""
        t0 = time.perf_counter()
        targets = self.shadows if self.staged else self.live
        if self.stream is not None:
            torch.cuda.set_device(self.device)
        with torch.cuda.stream(self.stream):  # a no-op without a stream (the CPU)
            load = self.loader.receive()
            self.received = fingerprint(p.data for p in targets.values())
        if self.stream is not None:
            self.stream.synchronize()
        return {"weight_recv_s": time.perf_counter() - t0, "weight_load_s": load}

    def _changed(self, out: dict) -> dict:
        """``out`` with ``weights_changed`` (1: the received weights differ from the live ones
        before)."""
        out["weights_changed"] = int(not torch.equal(self.received.cpu(), self.live_print.cpu()))
        self.live_print = self.received
        return out

    def _receive_and_signal(self) -> dict:
        try:
            return self._receive()
        finally:
            self.finished += 1
            if self.signal:
                tmp = f"{self.signal}.tmp"
                with open(tmp, "w") as f:
                    f.write(str(self.finished))
                os.replace(tmp, self.signal)  # read whole or not at all

    def begin(self) -> None:
        """Start receiving the next update (staged; a no-op otherwise)."""
        if self.pending is not None:
            raise RuntimeError("a weight update is already being received")
        if self.staged:
            self.pending = self.pool.submit(self._receive_and_signal)

    def done(self) -> bool:
        """Whether ``apply`` would not wait for the wire (always true unstaged: it receives
        itself)."""
        return self.pending is None or self.pending.done()

    @torch.no_grad()
    def apply(self) -> dict:
        """The update in the live parameters; timings (a failure of the receiving thread is raised
        here)."""
        if not self.staged:
            self._sync()
            out = self._receive()
            out["weight_swap_s"] = 0.0
            return self._changed(out)
        if self.pending is None:
            raise RuntimeError("apply before begin: no update is being received")
        out, self.pending = self.pending.result(), None
        t0 = time.perf_counter()
        self._sync()  # nothing queued by the engine may still read the old weights
        live = [p.data for p in self.live.values()]
        staged = [s.data for s in self.shadows.values()]
        if self.device.type == "cuda":
            torch._foreach_copy_(live, staged)
        else:
            for d, s in zip(live, staged, strict=True):
                d.copy_(s)
        self._sync()
        out["weight_swap_s"] = time.perf_counter() - t0
        return self._changed(out)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.shadows.clear()
        if self.signal:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.signal)


def receives_finished(path: str) -> int:
    """The count a ``StagedUpdate`` wrote to its signal file ``path`` (0 before the first)."""
    try:
        with open(path) as f:
            return int(f.read() or 0)
    except FileNotFoundError:
        return 0


def room_for_staging(live: dict[str, torch.nn.Parameter], bucket_bytes: int,
                     device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` has room for a shadow of every live parameter beside two bucket buffers,
    and why."""
    need = sum(p.numel() * p.element_size() for p in live.values())
    if device.type != "cuda":
        return True, f"host memory ({need / 2**30:.2f} GiB of staging)"
    free, _ = torch.cuda.mem_get_info(device)
    fits = need + 2 * bucket_bytes + STAGING_HEADROOM <= free
    return fits, (f"{need / 2**30:.2f} GiB of staging {'fits in' if fits else 'exceeds'} the "
                  f"{free / 2**30:.2f} GiB free beside the engine (lower "
                  "engine.gpu_memory_utilization to make room)")


def staging_choice(tp: int, plan: dict, room: Callable[[], tuple[bool, str]]) -> tuple[bool, str]:
    """Whether a GPU rank of an engine at tensor parallel size ``tp`` receives behind generation,
    and why: where ``plan["staging"]`` asks for it and ``room()`` finds the memory, at TP 1, or at
    TP > 1 only with ``plan["staged_tp"]`` (engine.vllm.staged_tp): there the receiving thread's
    broadcasts run beside the engine's own TP collectives, on two NCCL communicators in an order the
    ranks need not share."""
    if not plan["staging"]:
        return False, "staging off"
    if tp > 1 and not plan.get("staged_tp", False):
        return False, ("tensor_parallel_size > 1: received while the engine is paused "
                       "(engine.vllm.staged_tp=false)")
    return room()


class InplaceWorker:
    """Mixed into vLLM's GPU worker (``worker_extension_cls``): its methods run in every GPU worker
    of the engine, called by ``LLM.collective_rpc`` (``weights.InplaceReceiver``). ``self`` is
    vLLM's worker."""

    def areal_weights_join(self, plan: dict) -> dict:
        """Join the weight group at ``plan["rank_offset"]`` + this worker's TP rank and decide
        staged or direct; returns the rank, the choice and why."""
        from areal_cli.transport.weights import new_group

        live = dict(self.get_model().named_parameters())
        check_backends(moe_backends(self.get_model()))  # MoE: experts kept as the loaders write
        device = next(iter(live.values())).device  # the engine's GPU (this rank's)
        staged, why = staging_choice(self.vllm_config.parallel_config.world_size, plan,
                                     lambda: room_for_staging(live, plan["bucket_bytes"], device))
        rank = plan["rank_offset"] + self.vllm_config.parallel_config.rank
        high = bool(plan.get("high_priority", False))
        self.areal_store, pg = new_group(plan["host"], plan["port"], rank, plan["world_size"],
                                         plan["backend"],
                                         plan["timeout_s"], plan["store"], high)
        specs = [ParamSpec(n, tuple(s), int(torch.Size(s).numel())) for n, s in plan["specs"]]
        self.areal_switch = None  # the GIL switch interval to restore after a staged receive
        signal = f"{plan['signal']}.{rank}" if plan.get("signal") else None
        self.areal_weights = StagedUpdate(specs, live, pg, plan["backend"],
                                          getattr(torch, plan["wire_dtype"]),
                                          plan["bucket_bytes"], device, staged, signal, high)
        return {"rank": rank, "staged": staged, "why": why}

    def areal_weights_begin(self) -> None:
        """Start the staged receive. The receiving thread takes the GIL after every bucket beside
        the engine's busy loop: the process's GIL switch interval is short while it runs, and back
        to what it was at ``apply`` (outside a receive the engine's own threads, its loop and its
        output thread, keep Python's default, which lets a step's work run without being handed over
        every 0.5 ms)."""
        import sys

        from areal_cli.runtime import short_gil_switch

        if self.areal_weights.staged:
            self.areal_switch = sys.getswitchinterval()
            short_gil_switch()
        self.areal_weights.begin()

    def areal_weights_apply(self) -> dict:
        import sys

        try:
            return self.areal_weights.apply()
        finally:
            if self.areal_switch is not None:
                sys.setswitchinterval(self.areal_switch)
                self.areal_switch = None

    def areal_weights_close(self) -> None:
        self.areal_weights.close()

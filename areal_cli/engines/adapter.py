"""An engine's end of LoRA weight updates (trainer.lora.rank > 0, engine.lora_merge=false).

The adapter tensors (``lora.adapter_specs``: A and B of every targeted layer, float32) arrive
through areal's bucketed broadcast (transport/weights.py) into buffers of their own; each engine
applies them its way (hf: ``MergedAdapter`` below, merged into its weights in place; vllm: through
vLLM's LoRA API). Every update is then verified (``ProbeCheck``): the engine's logprobs of a fixed
probe sequence must differ from those of the previous version, unless the adapter did not change
at all: every layer's B @ A as before, or, for the hf engine, no weight changed at its precision
(reported as ``adapter_delta_zero``). A sync that did nothing stops the run with
``AdapterSyncError`` instead of sampling from the old policy while the trainer believes it is
on-policy.
"""

from __future__ import annotations

import time

import torch

from areal_cli import faults, lora
from areal_cli.config.resolve import bucket_bytes
from areal_cli.engines.base import WeightSource
from areal_cli.transport.weights import WeightReceiver

PROBE_TOKENS = 32
"""Length of the probe sequence."""
PROBE_POSITIONS = 4
"""hf: positions at the end of the probe whose next-token distributions are compared."""


class WeightSyncError(RuntimeError):
    """A weight update that changed the weights left the engine's outputs unchanged."""


class AdapterSyncError(WeightSyncError):
    """A weight update whose adapter changed left the engine's outputs unchanged."""


def adapter_receiver(buffers: dict[str, torch.Tensor], source: WeightSource,
                     index: int) -> WeightReceiver:
    """Rollout worker ``index``'s end of the broadcast, loading into ``buffers`` (float32, wire
    order)."""
    cfg, w = source.cfg, source.cfg.weights
    return WeightReceiver(None, source.host, source.port, 1 + index, 1 + cfg.rollout.workers,
                          str(w.backend),
                          torch.float32, bucket_bytes(w), timeout_s=cfg.launcher.peer_timeout_s,
                          targets=buffers,
                          store_path=source.store)


def broadcast_sender(cfg, host: str, port: int, model, device, store: str = ""):
    """Trainer rank 0's end of areal's bucketed broadcast (hf always; vllm with LoRA) of
    ``lora.update_specs`` (the adapter, float32, or the merged weights in the wire dtype)."""
    from areal_cli.config.choices import Switch
    from areal_cli.transport.weights import WeightSender

    w = cfg.weights  # resolved when the run was planned
    wire = torch.float32 if lora.sends_adapter(cfg) else getattr(torch, w.dtype)
    return WeightSender(lora.update_specs(model, cfg), host, port, 1 + cfg.rollout.workers,
                        str(w.backend),
                        device, wire, bucket_bytes(w), timeout_s=2 * cfg.launcher.peer_timeout_s,
                        staged=w.staged == Switch.true, store_path=store)


def probe_ids(vocab_size: int) -> list[int]:
    """The fixed probe: ``PROBE_TOKENS`` token ids drawn once from a seeded generator."""
    gen = torch.Generator().manual_seed(1234)
    return torch.randint(min(100, vocab_size - 1), vocab_size, (PROBE_TOKENS,),
                         generator=gen).tolist()


def adapter_moved(new: dict[str, torch.Tensor], old: dict[str, torch.Tensor]) -> bool:
    """Whether B @ A of some layer differs between two adapters (wire names): exactly zero where A
    and B are unchanged, or where B is zero in both (a fresh adapter: its random A moves
    nothing)."""
    for name in new:
        if not name.endswith(".lora_B.weight"):
            continue
        a = name.removesuffix(".lora_B.weight") + ".lora_A.weight"
        same = torch.equal(new[name], old[name]) and torch.equal(new[a], old[a])
        if not same and not (not new[name].any() and not old[name].any()):
            return True
    return False


class ProbeCheck:
    """Compares each version's probe logprobs with the previous version's. ``of``: what an update
    changes, "adapter" (LoRA adapters: AdapterSyncError, ``adapter_delta_zero``) or "weights" (full
    weights, merged adapters included: WeightSyncError, ``weights_unchanged``)."""

    def __init__(self, of: str = "adapter"):
        self.of, self.last = of, None

    def check(self, version: int, logprobs: torch.Tensor, changed: bool) -> dict:
        """Timings-style figures of this update; AdapterSyncError (WeightSyncError) if the adapter
        (the weights) changed but the logprobs did not."""
        logprobs = logprobs.detach().float().cpu()
        last, self.last = self.last, logprobs
        moved = float((logprobs - last).abs().max()) if last is not None else float("nan")
        if last is not None and changed and moved == 0.0:
            error, fix = ((AdapterSyncError, "check the engine's LoRA loading (or run with "
                           "engine.lora_merge=true to send merged weights "
                           "instead)") if self.of == "adapter" else
                          (WeightSyncError, "check the engine's weight loading (or run with "
                           "engine.weight_update=reload)"))
            raise error(
                f"weight update to version {version}: the {self.of} changed but the engine's "
                "logprobs of the probe sequence did not: the update did not take effect, and "
                f"generation would go on sampling from the previous policy. Stopped; {fix}")
        key = "adapter_delta_zero" if self.of == "adapter" else "weights_unchanged"
        return {"probe_logp_change": moved, key: int(not changed)}


def engine_merge(w0: torch.Tensor, a: torch.Tensor, b: torch.Tensor, s: float) -> torch.Tensor:
    """W0 + s · B @ A for an engine: one GEMM in W0's dtype (float32 accumulation, one rounding),
    with A and B rounded to it first. In bf16 much faster on the CPU than the float32 sum
    ``lora.merge`` makes for checkpoints, and within one bf16 step of it (BENCHMARKS.md "Small costs
    behind defaults")."""
    if w0.dtype == torch.float32:
        return lora.merge(w0, a, b, s)
    return torch.addmm(w0, b.to(w0.dtype), a.to(w0.dtype), alpha=s)


class MergedAdapter:
    """The hf engine's intake: W = W0 + (alpha / rank) · B @ A written into each targeted layer's
    weight in place, from a copy of W0 kept at the engine's dtype (exact: no rounding drift over
    versions)."""

    def __init__(self, model: torch.nn.Module, source: WeightSource, index: int):
        cfg = source.cfg
        self.model, self.lora, self.scale = model, cfg.trainer.lora, lora.scale(cfg.trainer.lora)
        self.layers = lora.target_layers(model, self.lora)
        self.base = {name: m.weight.detach().clone() for name, m in self.layers}
        device = next(model.parameters()).device
        self.buffers = {s.name: torch.zeros(s.shape, dtype=torch.float32, device=device)
                        for s in lora.adapter_specs(model, self.lora)}
        self.probe = torch.tensor([probe_ids(model.config.vocab_size)], device=device)
        self.verify = ProbeCheck()
        self.receiver = adapter_receiver(self.buffers, source, index)

    @torch.no_grad()
    def probe_logprobs(self) -> torch.Tensor:
        """The log-softmax over the whole vocabulary at the probe's last ``PROBE_POSITIONS``
        positions (the output layer runs on those alone: most of a forward's cost on a CPU)."""
        logits = self.model(input_ids=self.probe, logits_to_keep=PROBE_POSITIONS).logits[0].float()
        return torch.log_softmax(logits, -1)

    @torch.no_grad()
    def receive(self, version: int = -1) -> dict:
        if self.verify.last is None:  # the weights before the first update
            self.verify.check(version - 1, self.probe_logprobs(), changed=False)
        out = self.receiver.receive(version)
        t0, changed, skip = time.perf_counter(), False, faults.skipped("adapter", version)
        for name, m in self.layers:
            w = engine_merge(self.base[name], self.buffers[f"{name}.lora_A.weight"],
                             self.buffers[f"{name}.lora_B.weight"], self.scale)
            changed = changed or not torch.equal(w, m.weight)  # the delta at the engine's precision
            if not skip:
                m.weight.copy_(w)
        out["adapter_merge_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        out.update(self.verify.check(version, self.probe_logprobs(), changed))
        out["probe_s"] = time.perf_counter() - t0
        return out

    def digest(self) -> str:
        return self.receiver.digest()

    def close(self) -> None:
        self.receiver.close()

"""Both ends of weight updates for the vLLM engine (``vllm.py``): the rollout worker's receiving end
(``weight_receiver``: areal's in-place intake or vLLM's own transfer; ``VLLMAdapter``: LoRA adapters
loaded through vLLM's LoRA API) and trainer rank 0's sending end (``make_sender``)."""

from __future__ import annotations

import logging
import time

from areal_cli import lora
from areal_cli.config.choices import WeightUpdate
from areal_cli.config.schema import EngineConfig, RootConfig
from areal_cli.engines.base import WeightSource

log = logging.getLogger(__name__)


def weight_receiver(llm, model_path, source: WeightSource, index: int):
    """This rollout worker's end of the weight transfer (engine.weight_update): its GPU ranks follow
    trainer rank 0 at ``rank_offset``."""
    import torch

    from areal_cli.config.resolve import bucket_bytes
    from areal_cli.engines.vllm.weights import (
        InplaceReceiver,
        VLLMWeightReceiver,
        group_size,
        rank_offset,
        wire_spec,
    )

    cfg, e = source.cfg, source.cfg.engine
    wire = getattr(torch, cfg.weights.dtype)  # resolved when the run was planned
    tp = e.vllm.tensor_parallel_size
    first, world = rank_offset(index, tp), group_size(cfg.rollout.workers, tp)
    if e.weight_update == WeightUpdate.inplace:
        return InplaceReceiver(llm, wire_spec(model_path, wire), dict(
            host=source.host, port=source.port, store=source.store, rank_offset=first,
            world_size=world,
            backend=str(cfg.weights.backend), wire_dtype=cfg.weights.dtype,
            bucket_bytes=bucket_bytes(cfg.weights),
            timeout_s=2 * cfg.launcher.peer_timeout_s, staging=e.vllm.staging,
            staged_tp=e.vllm.staged_tp,
            high_priority=cfg.weights.high_priority))
    return VLLMWeightReceiver(llm, wire_spec(model_path, wire), source.host, source.port, first,
                              world)


class VLLMAdapter:
    """A vLLM rollout worker's end of LoRA updates. The adapter arrives through areal's bucketed
    broadcast into float32 buffers (``adapter.adapter_receiver``), is written in peft's format to a
    directory on tmpfs (/dev/shm where it exists) and loaded through vLLM's own LoRA API:
    ``add_lora`` of one
    ``LoRARequest`` (id 1) with ``load_inplace=True``, which replaces the loaded adapter of that id;
    every request submitted after the update names it. vLLM 0.26 loads adapters from a path only (no
    in-memory route). Verified as every LoRA update is (``adapter.ProbeCheck``), from vLLM's prompt
    logprobs of the probe."""

    NAME, ID = "areal-policy", 1

    # engine: the VLLMEngine it serves
    def __init__(self, engine, model_path, source: WeightSource, index: int):
        import tempfile
        from pathlib import Path

        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from areal_cli.engines.adapter import ProbeCheck, adapter_receiver, probe_ids

        cfg = source.cfg
        self.engine, self.lora, self.model_path = engine, cfg.trainer.lora, str(model_path)
        config = AutoConfig.from_pretrained(model_path)
        with torch.device("meta"):
            specs = lora.adapter_specs(AutoModelForCausalLM.from_config(config), self.lora)
        from areal_cli.transport.weights import on_device

        gpu = on_device(cfg.weights.backend)
        device = torch.device("cuda", torch.cuda.current_device()) if gpu else "cpu"
        self.buffers = {s.name: torch.zeros(s.shape, dtype=torch.float32, device=device)
                        for s in specs}
        # vLLM computes with its adapters in the model's dtype (LoRAConfig.lora_dtype "auto"): the
        # adapter is rounded to it once here, compared at it (a change lost in rounding is no change
        # to the engine) and written at it (half the bytes of float32 to write and read back in the
        # pause)
        self.dtype = engine_dtype(cfg.engine)
        self.previous = {n: b.to(self.dtype) for n, b in self.buffers.items()}
        shm = Path("/dev/shm")
        self.root = Path(tempfile.mkdtemp(prefix="areal-lora-", dir=shm if shm.is_dir() else None))
        self.probe = probe_ids(config.vocab_size)
        self.verify = ProbeCheck()
        self.receiver = adapter_receiver(self.buffers, source, index)
        log.info("weight updates: LoRA adapters (rank %d, %d tensors) through areal's broadcast, "
                 "loaded by vLLM's LoRA API from %s", self.lora.rank, len(specs), self.root)

    def receive(self, version: int = -1) -> dict:
        import shutil

        from areal_cli import faults
        from areal_cli.engines.adapter import adapter_moved
        from areal_cli.lora import save_adapter

        if self.verify.last is None:  # the weights before the first update
            self.verify.check(version - 1, self.engine.probe_logprobs(self.probe), changed=False)
        out = self.receiver.receive(version)
        t0 = time.perf_counter()
        rounded = {n: b.to(self.dtype) for n, b in self.buffers.items()}
        changed = adapter_moved(rounded, self.previous)
        if not faults.skipped("adapter", version):
            path = self.root / f"v{version}"
            save_adapter(path, iter(rounded.items()), self.lora, self.model_path, dtype=self.dtype)
            out["adapter_write_s"] = time.perf_counter() - t0
            self._load(path)
            for old in self.root.iterdir():  # vLLM holds the adapter in memory: older files can go
                if old != path:
                    shutil.rmtree(old, ignore_errors=True)
        out["adapter_load_s"] = time.perf_counter() - t0
        self.previous = rounded
        t0 = time.perf_counter()
        out.update(self.verify.check(version, self.engine.probe_logprobs(self.probe), changed))
        out["probe_s"] = time.perf_counter() - t0
        return out

    def _load(self, path) -> None:
        from vllm.lora.request import LoRARequest

        if not self.engine.core.add_lora(LoRARequest(self.NAME, self.ID, str(path),
                                                     load_inplace=True)):
            raise RuntimeError(f"vLLM refused the LoRA adapter in {path}")
        self.engine.lora_request = LoRARequest(self.NAME, self.ID, str(path))

    def digest(self) -> str:
        return self.receiver.digest()

    def close(self) -> None:
        import shutil

        self.receiver.close()
        shutil.rmtree(self.root, ignore_errors=True)


def make_sender(cfg: RootConfig, host: str, port: int, model, device, store: str = ""):
    """Trainer rank 0's end of the weight transfer: rank 0, every worker's GPU ranks after it (with
    engine.lora_merge: the merged weights). inplace: areal's bucketed broadcast (``InplaceReceiver``
    receives); reload: vLLM's NCCL transfer; a LoRA adapter goes through areal's bucketed broadcast
    to
    ``VLLMAdapter``."""
    import torch

    if lora.sends_adapter(cfg):
        from areal_cli.engines.adapter import broadcast_sender

        return broadcast_sender(cfg, host, port, model, device, store)

    from areal_cli.config.resolve import bucket_bytes
    from areal_cli.engines.vllm.weights import VLLMWeightSender, group_size
    from areal_cli.transport.weights import WeightSender

    world = group_size(cfg.rollout.workers, cfg.engine.vllm.tensor_parallel_size)
    wire, staged = getattr(torch, cfg.weights.dtype), cfg.weights.staged == "true"
    if cfg.engine.weight_update == WeightUpdate.inplace:
        return WeightSender(lora.update_specs(model, cfg), host, port, world,
                            str(cfg.weights.backend), device, wire,
                            bucket_bytes(cfg.weights), timeout_s=2 * cfg.launcher.peer_timeout_s,
                            staged=staged,
                            store_path=store, high_priority=cfg.weights.high_priority)
    return VLLMWeightSender(host, port, world, wire, specs=sender_specs(model, cfg), staged=staged)


def sender_specs(model, cfg: RootConfig) -> list[tuple[str, list[int]]]:
    """(name, full shape) of what one update of ``model`` sends to vLLM, in order: every parameter,
    or with engine.lora_merge the merged plain parameters (no adapter or ``base_layer`` names, which
    vLLM's checkpoint format lacks). A DTensor's shape is the full one."""
    return [(s.name, list(s.shape)) for s in lora.update_specs(model, cfg)]


def engine_dtype(e: EngineConfig):
    """The torch dtype of the engine's weights (engine.dtype; "auto" is bfloat16)."""
    import torch

    name = str(e.dtype)
    return torch.bfloat16 if name == "auto" else getattr(torch, name)

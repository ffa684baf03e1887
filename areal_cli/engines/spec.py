"""What an engine declares about itself, and the one place the rest of areal reads it from.

Each engine package (``engines/<name>/``) has a ``spec.py`` defining ``SPEC``, an ``EngineSpec`` (or
a subclass that overrides the planning methods): the config's ``auto`` values, the launcher's device
and weight plan and the evaluator ask it, never the engine's name. Importing a spec imports no
engine and no torch: configs validate with it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from areal_cli.config.choices import WeightUpdate
from areal_cli.config.schema import EngineConfig, RootConfig


@dataclass(frozen=True)
class EngineSpec:
    """What the rest of areal needs to know about one engine."""

    name: str
    """The ``engine=`` value (and the name of its package under ``areal_cli/engines/``)."""
    loads_model: bool
    """Builds its model from the checkpoint path itself (vllm.LLM, in its own workers); else it
    runs a torch model that its caller loads (HFEngine)."""
    tensor_parallel: bool
    """One engine spans ``engine.vllm.tensor_parallel_size`` GPUs; else it takes one device."""
    fp32_logits: bool
    """``engine.lm_head_fp32=auto`` means on: the engine's logprobs come from a float32 head, so
    the trainer's must too."""
    merges_lora: bool
    """``engine.lora_merge=auto`` means on: the trainer merges the adapter and sends full weights
    (an engine whose own weight transfer carries whole layers), else the adapter alone."""
    lora_apply: str
    gpu_only: bool = False
    """Computes on GPUs only: its ``engine.dtype=auto`` is bfloat16 wherever it is planned."""
    """How the engine applies a received LoRA adapter (the plan's note)."""
    asleep_bytes: int = -1
    """GPU memory the engine still holds while it sleeps (``cluster.share=alternate``): what its
    device context and allocator keep; -1 = it cannot sleep (it keeps its whole share)."""
    module: str = "engine"
    """The module of its package that defines ``ENGINE`` and ``make_sender``."""
    package: str = ""
    """A package the engine imports that the core install lacks ("" = none)."""
    install: str = ""
    """How to install ``package``."""

    def require(self, setting: str = "engine") -> None:
        """Import ``package``, or ValueError naming how to install it (``setting``: the key that
        chose this engine, e.g. reward.judge.engine)."""
        if not self.package:
            return
        try:
            importlib.import_module(self.package)
        except ImportError as err:
            raise ValueError(f"{setting}={self.name} needs {self.package} ({err}): {self.install}, "
                             f"or use {setting}=hf") from None

    def load(self):
        """The engine's module (``ENGINE``, ``make_sender``); importing it imports no optional
        package."""
        return importlib.import_module(f"areal_cli.engines.{self.name}.{self.module}")

    # What the planner asks (config/resolve and launcher/plan); an engine with a transfer of its own
    # overrides them. The defaults are areal's bucketed broadcast into the engine's torch
    # parameters.

    def weight_update(self, engine: EngineConfig, model_path: Path | None) -> WeightUpdate:
        """``engine.weight_update=auto`` for a run that updates weights, from the model (None = not
        fetched yet)."""
        return WeightUpdate.inplace  # the broadcast loads into the torch model's own parameters

    def weight_notes(self, asked: RootConfig, cfg: RootConfig,
                     model_path: Path | None) -> list[str]:
        """How weights reach every rollout worker under the resolved ``cfg`` (``asked``: before it
        was resolved), for the plan (--dry-run)."""
        w, wt = cfg.rollout.workers, cfg.weights
        return [f"in place into each {self.name} engine's parameters; one {wt.backend} group of "
                f"{1 + w} ranks (trainer rank 0 + {w} rollout worker(s)), {wt.bucket_mb} MiB "
                "buckets"
                + (", staged" if wt.staged == "true" else "")]

    def check_shared_gpu(self, cfg: RootConfig, gpu: int) -> None:
        """ValueError naming the fix where this engine, under the resolved ``cfg``, cannot sit on
        trainer rank 0's GPU ``gpu`` (the update then goes through CUDA IPC)."""

    def shared_card(self, cfg: RootConfig, card: int, model_path: Path | None) -> int:
        """Bytes of a GPU of ``card`` bytes left to the trainer when one of these engines shares
        it."""
        return card // 2

    def share_why(self, cfg: RootConfig, model_path: Path | None) -> str:
        """What this engine's share of a shared GPU holds, for the plan."""
        return "half the GPU: the model and the KV cache in engine.gpu_memory_utilization of it"

"""The generation engines (``hf``, ``vllm``) and what tells them apart, in one place.

Code outside this package never tests an engine's name: it asks ``spec(cfg.engine.name)``, and
never imports an engine's module: it gets an engine from ``factory.make_engine`` and the trainer's
end of the engine's weight transfer from ``factory.make_sender`` (``make lint``'s ``structure``
checks hold every other file to both). Importing this module imports no engine, no torch:
configs validate with it.

Adding an engine is one module here and one ``ENGINES`` entry naming it. The module defines
``ENGINE``, its ``base.Engine`` class, built as ``ENGINE(setup)`` from a ``setup.EngineSetup``
(it owns its model, its KV cache sizing, its sampling and its weight intake), and
``make_sender(cfg, host, port, model, device)``: trainer rank 0's end of its weight transfer.

The engines themselves are shared, not the rollout worker's alone: the evaluator generates with
them too, and the trainer and the launcher read their specs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    """What the rest of areal needs to know about one engine."""

    name: str
    """The ``engine=`` value."""
    loads_model: bool
    """Builds its model from the checkpoint path itself (vllm.LLM, in its own workers); else it
    runs a torch model that its caller loads (HFEngine)."""
    tensor_parallel: bool
    """One engine spans ``engine.tensor_parallel_size`` GPUs; else it takes one device."""
    weight_transfer: str
    """How a rollout worker receives new weights: "broadcast" (areal's bucketed broadcast into
    the torch model, transport/weights.py) | "engine" (the engine's own NCCL weight transfer,
    transport/vllm_weights.py)."""
    fp32_logits: bool
    """``engine.lm_head_fp32=auto`` means on: the engine's logprobs come from a float32 head, so
    the trainer's must too."""
    module: str = ""
    """Its module in this package (``areal_cli.rollout.engines.<module>``); "" = ``name``."""
    package: str = ""
    """A package the engine imports that the core install lacks ("" = none)."""
    install: str = ""
    """How to install ``package``."""

    def require(self, setting: str = "engine") -> None:
        """Import ``package``, or ValueError naming how to install it (``setting``: the key that chose
        this engine, e.g. reward.judge.engine)."""
        if not self.package:
            return
        try:
            importlib.import_module(self.package)
        except ImportError as err:
            raise ValueError(f"{setting}={self.name} needs {self.package} ({err}): {self.install}, "
                             f"or use {setting}=hf") from None

    def load(self):
        """The engine's module (``ENGINE``, ``make_sender``); importing it imports no optional package."""
        return importlib.import_module(f"{__name__}.{self.module or self.name}")


ENGINES = {
    "hf": EngineSpec("hf", loads_model=False, tensor_parallel=False, weight_transfer="broadcast",
                     fp32_logits=False, module="hf_select"),
    "vllm": EngineSpec("vllm", loads_model=True, tensor_parallel=True, weight_transfer="engine",
                       fp32_logits=True, package="vllm",
                       install="pip install 'areal-cli[vllm]' (GPU machines only)"),
}


def unknown(name: str) -> str:
    """The problem with an ``engine=`` value that names no engine ("" when it names one)."""
    if name in ENGINES:
        return ""
    return f"engine={name!r}: use " + " or ".join(f"engine={n}" for n in ENGINES)


def spec(name: str) -> EngineSpec:
    """The spec of engine ``name``; ValueError naming the engines there are."""
    if name not in ENGINES:
        raise ValueError(unknown(name))
    return ENGINES[name]

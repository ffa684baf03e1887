"""The generation engines (``hf/``, ``vllm/``): one package each, found by their ``spec.py``.

Code outside this package never tests an engine's name: it asks ``spec(cfg.engine.name)`` (an
``EngineSpec``, ``spec.py``), and never imports an engine's module: it gets an engine from
``factory.make_engine`` and the trainer's end of the engine's weight transfer from
``factory.make_sender`` (the structure lint holds every other file to both). Importing this module
imports no engine, no torch: configs validate with it.

Adding an engine is one package here and nothing else: ``engines/<name>/spec.py`` defines ``SPEC``
(what it declares) and the module ``SPEC.module`` names defines ``ENGINE``, its ``base.Engine``
class, built as ``ENGINE(setup, doing)`` from a ``base.EngineSetup`` (it owns its model, its KV
cache sizing, its sampling and its weight intake), and ``make_sender(cfg, host, port, model,
device, store)``: trainer rank 0's end of its weight transfer.

The engines are shared, not the rollout worker's alone: the evaluator and the model-judge reward
generate with them too, and the trainer and the launcher read their specs.
"""

from __future__ import annotations

import importlib
import pkgutil

from areal_cli.engines.spec import EngineSpec


def engines() -> dict[str, EngineSpec]:
    """Every engine package under this one, by name, in name order."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.ispkg:
            s = importlib.import_module(f"{__name__}.{info.name}.spec").SPEC
            found[s.name] = s
    return found


def unknown(name: str) -> str:
    """The problem with an ``engine=`` value that names no engine ("" when it names one)."""
    known = engines()
    if name in known:
        return ""
    return f"engine={name!r}: use " + " or ".join(f"engine={n}" for n in known)


def spec(name: str) -> EngineSpec:
    """The spec of engine ``name``; ValueError naming the engines there are."""
    known = engines()
    if name not in known:
        raise ValueError(unknown(name))
    return known[name]


def spanning() -> list[str]:
    """The engines one of which can span several GPUs (``engine.vllm.tensor_parallel_size`` > 1)."""
    return [n for n, s in engines().items() if s.tensor_parallel]

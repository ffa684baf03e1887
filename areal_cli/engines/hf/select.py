"""engine=hf: the slot loop on the CPU (slots.py), transformers' continuous batching (engine.py) on
a GPU, with engine.hf.cpu_batching=paged, or for a model the slot loop does not fit."""

from __future__ import annotations

from collections.abc import Callable

from areal_cli.engines.base import EngineSetup
from areal_cli.engines.hf.engine import HFEngine, engine_device, make_sender
from areal_cli.engines.hf.slots import SlotEngine, slots_fit

__all__ = ["ENGINE", "make_sender"]


def uses_slots(setup: EngineSetup) -> bool:
    """The slot loop decodes: a CPU device, engine.hf.cpu_batching=slots and a model it fits."""
    from transformers import AutoConfig

    if engine_device(setup.device).type != "cpu" or str(setup.engine.hf.cpu_batching) != "slots":
        return False
    return slots_fit(AutoConfig.from_pretrained(setup.model_path))


class HFSelect(HFEngine):
    """Builds a ``SlotEngine`` or an ``HFEngine`` (both ``HFEngine``s) for ``setup``."""

    def __new__(cls, setup: EngineSetup, doing: Callable[[str], None]) -> HFEngine:
        return (SlotEngine if uses_slots(setup) else HFEngine)(setup, doing)


ENGINE = HFSelect

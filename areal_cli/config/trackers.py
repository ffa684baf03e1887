"""The backends by name: where each lives and which package it needs. No heavy import here
(config validation reads it): a backend's module is imported only when a run opens it."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    module: str  # areal_cli.tracking.<module>, holding the class below
    cls: str
    package: str  # the import the backend needs (checked before any process starts)


BACKENDS: dict[str, Backend] = {
    "tensorboard": Backend("tensorboard_log", "TensorBoardTracker", "tensorboard"),
    "wandb": Backend("wandb_log", "WandbTracker", "wandb"),
    "mlflow": Backend("mlflow_log", "MlflowTracker", "mlflow"),
}
ALWAYS = "jsonl"  # metrics.jsonl: written by controller/records.py whatever the list says
EXTRA = "tracking"  # pip install 'areal-cli[tracking]' brings every backend's package


def chosen(backends: list) -> list[str]:
    """The tracker backends of ``logging.backends`` (jsonl is no tracker), in order, once each."""
    return list(dict.fromkeys(str(b) for b in backends if str(b) != ALWAYS))


def problems(cfg) -> list[str]:
    """The ``logging`` config's problems with their fix: an unknown backend name, one whose
    package is not installed (logging.wandb_mode is an enum: config/choices.py)."""
    out = []
    for name in chosen(cfg.backends):
        b = BACKENDS.get(name)
        if b is None:
            out.append(f"logging.backends: unknown backend {name!r}: use any of "
                       f"{', '.join([ALWAYS, *BACKENDS])}")
        elif not installed(b.package):
            out.append(f"logging.backends includes {name}, but the {b.package} package is not "
                       f"installed: pip install 'areal-cli[{EXTRA}]' (or pip install {b.package}), "
                       f"or drop {name} from logging.backends")
    return out


def installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package broken or a None entry in sys.modules
        return False

"""The one interface every tracker backend implements, and what a backend is given to start."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from areal_cli.config.schema import LoggingConfig

SAMPLE_COLUMNS = ["step", "prompt_id", "prompt", "completion", "reward", "tokens", "finish",
                  "staleness"]


@dataclass
class RunInfo:
    """What a backend needs to open (or reopen) its run."""

    run_dir: Path
    name: str
    """The run's name in every tracker: the run directory's name."""
    cfg: LoggingConfig
    hparams: dict
    """The resolved config, flattened (``trainer.lr`` → value)."""
    config_yaml: str
    state: dict = field(default_factory=dict)
    """What this backend stored in tracking.json when it first opened the run (its run id):
    empty for a new run; a resume reopens the same tracker run from it."""
    resume_step: int | None = None
    """A resume from the checkpoint of this version: steps from here on are trained (and logged)
    again. None: a fresh run, or reopened only to add the closing evaluation."""


class Tracker(ABC):
    """A backend. Steps arrive in increasing order; a backend that cannot overwrite a step it
    already holds is never sent one again (fanout.py). Any exception switches the backend off."""

    name = ""
    where = ""
    """Where it logs, for the controller's log (set by ``start``)."""
    rewinds = False
    """True where the backend itself drops what was logged from ``resume_step`` on (TensorBoard's
    purge); others keep the values they first received for those steps."""

    @abstractmethod
    def start(self, info: RunInfo) -> dict:
        """Open the run; returns what to store for a resume (e.g. {"id": ...})."""

    @abstractmethod
    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """One step's scalar metrics."""

    @abstractmethod
    def log_samples(self, step: int, rows: list[list]) -> None:
        """A table of sample completions, columns SAMPLE_COLUMNS."""

    @abstractmethod
    def log_summary(self, step: int, values: dict[str, float], text: str) -> None:
        """The closing evaluation: figures at ``step`` (the last one) and a report."""

    @abstractmethod
    def close(self) -> None:
        """Flush and close the run."""

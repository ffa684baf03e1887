"""Fault injection for the reliability tests: ``AREAL_FAULT=<point>@<version>[,<version>...]``.

When a process reaches ``point`` at policy ``version`` it writes ``<run_dir>/FAULT_REACHED``
and then either freezes (``hang``, the default: the test kills or stops it from outside at
exactly that moment), exits at once (``AREAL_FAULT_MODE=exit``) or pauses for
``AREAL_FAULT_PAUSE_S`` seconds (default 10) and goes on (``AREAL_FAULT_MODE=pause``: a signal
sent meanwhile is handled as it would be mid-step). Points: ``generate`` (a
rollout worker starting a group), ``train`` (a trainer rank inside a step), ``weights`` (a
rollout worker about to receive a weight update), ``reward`` (a reward call that never returns).
``adapter`` (a LoRA engine about to apply a received adapter; ``AREAL_FAULT_MODE=skip`` leaves it
unapplied: a weight sync that does nothing, which the engine's verification must catch).
``grad`` (a trainer rank whose step ``version`` gets a NaN gradient after its backward, as an
overflow would leave it: the step is skipped, its batch kept, and the run goes on or stops per
``trainer.max_nonfinite_steps``; ``AREAL_FAULT=grad@1,2`` arms several versions).
``AREAL_FAULT_RANK=r`` limits it to trainer rank r. Unset in normal runs: then every call is a
dictionary lookup and nothing else.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from areal_cli.rundir import RunDir

_SPEC = os.environ.get("AREAL_FAULT", "")


def point(name: str, version: int, run_dir: str | Path) -> None:
    if not armed(name, version):
        return
    RunDir(run_dir).fault_reached.write_text(f"{name}@{version} pid {os.getpid()}\n")
    mode = os.environ.get("AREAL_FAULT_MODE", "hang")
    if mode == "exit":
        os._exit(17)
    if mode == "pause":
        time.sleep(float(os.environ.get("AREAL_FAULT_PAUSE_S", "10")))
        return
    while True:
        time.sleep(3600)


def armed(name: str, version: int) -> bool:
    """Whether ``AREAL_FAULT=<name>@<v>[,<v>...]`` names this ``version`` (and ``AREAL_FAULT_RANK``,
    where set, this trainer rank): every fault point asks this; ``grad`` alone acts on it directly
    (it changes what a step computes instead of stopping the process)."""
    if not _SPEC or "@" not in _SPEC:
        return False
    spec_name, versions = _SPEC.split("@", 1)
    rank = os.environ.get("AREAL_FAULT_RANK")
    return (spec_name == name and str(version) in versions.split(",")
            and (rank is None or rank == os.environ.get("RANK", "0")))


def skipped(name: str, version: int) -> bool:
    """Whether ``AREAL_FAULT=<name>@<version>`` with ``AREAL_FAULT_MODE=skip`` asks to leave this
    step out."""
    return armed(name, version) and os.environ.get("AREAL_FAULT_MODE") == "skip"

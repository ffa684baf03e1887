"""Which checkpoint a resume starts from, and which ones pruning may delete; the trainer and the
controller both ask.

A checkpoint of version v is the directory ``checkpoints/step_<v>``; it is complete once the
controller has written its part and the marker ``MARKER`` (naming v) into ``step_<v>.partial``
and renamed it (``controller/state.py``). Only such directories are the run's: a directory named
otherwise (a user's ``step_9_mycopy``), one without the marker or with another version's (a copy
renamed), or a symbolic link is never picked by resume and never pruned.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from areal_cli.rundir import RunDir

MARKER = "checkpoint.json"
"""Written by the controller into every checkpoint it completes: ``{"version": v}``."""

_NAME = re.compile(r"step_(\d+)")


def marker_text(version: int) -> str:
    return json.dumps({"version": version})


def run_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(version, directory) of every complete checkpoint the run wrote under ``root``
    (``checkpoints/``), oldest first."""
    found = []
    for d in root.glob("step_*") if root.is_dir() and not root.is_symlink() else []:
        m = _NAME.fullmatch(d.name)
        if m is None or d.is_symlink() or not d.is_dir():
            continue
        marker = d / MARKER
        if (marker.is_file() and not marker.is_symlink()
                and _marked_version(marker) == int(m.group(1))):
            found.append((int(m.group(1)), d))
    return sorted(found)


def _marked_version(marker: Path) -> int | None:
    try:
        version = json.loads(marker.read_text()).get("version")
    except (OSError, ValueError, AttributeError):
        return None
    return version if isinstance(version, int) else None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint the run wrote (``run_checkpoints``), or None."""
    found = run_checkpoints(RunDir(run_dir).checkpoints)
    return found[-1][1] if found else None

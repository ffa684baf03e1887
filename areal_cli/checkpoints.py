"""Which checkpoint a resume starts from; the trainer and the controller both ask.

A checkpoint of version v is the directory ``checkpoints/step_<v>``; it is complete once the
controller has renamed ``step_<v>.partial`` to it (``controller/state.py``), with its
``controller.json`` inside.
"""

from __future__ import annotations

from pathlib import Path

from areal_cli.rundir import RunDir


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete ``checkpoints/step_<v>`` (never a ``.partial`` one, never a link)."""
    found = []
    for d in RunDir(run_dir).checkpoints.glob("step_*"):
        if d.name.endswith(".partial") or d.is_symlink() or not d.name.split("_")[1].isdigit():
            continue
        if (d / "controller.json").is_file():
            found.append((int(d.name.split("_")[1]), d))
    return max(found)[1] if found else None

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


def _marker_problem(marker: Path) -> str | None:
    """Why a marker file is unreadable (None: it reads as ``{"version": <int>}``)."""
    try:
        version = json.loads(marker.read_text()).get("version")
    except (OSError, ValueError, AttributeError) as err:
        return f"{type(err).__name__}: {err}"
    return None if isinstance(version, int) else f"its version is {version!r}, not an integer"


RECORD_KEYS = {"metrics.jsonl": "step", "trajectories.jsonl": "trained_version",
               "weight_updates.jsonl": "version"}
"""Each record file of a run → the integer key a resume cuts it at (controller/state.py)."""


def record_problems(run_dir: Path) -> list[str]:
    """Record files a resume could not cut at its checkpoint: a damaged line that is not the last
    (a torn last line is an interrupted write, dropped on resume), or a row without its integer
    key. Each names the file, the line and what to do."""
    from areal_cli.durable import TornFile, read_jsonl

    out = []
    for path in RunDir(run_dir).records:
        if not path.is_file():
            continue
        key = RECORD_KEYS[path.name]
        try:
            rows, _ = read_jsonl(path)
        except TornFile as err:
            out.append(str(err))
            continue
        except (OSError, UnicodeDecodeError) as err:
            out.append(f"{path}: unreadable ({type(err).__name__}: {err}); restore it or move it "
                       "away (the run's other records are kept)")
            continue
        for n, row in enumerate(rows, 1):
            value = row.get(key) if isinstance(row, dict) else None
            if not isinstance(value, int) or isinstance(value, bool):
                out.append(f"{path}: row {n} has no integer {key!r} (a resume cuts the file at "
                           "its checkpoint by it); restore the file, or cut it before that row")
                break
    return out


def resume_problems(run_dir: Path) -> list[str]:
    """What stops a resume of ``run_dir`` before anything is read back or truncated: a checkpoint
    marker that exists but does not read (the checkpoint it marks could not be told from a copy, and
    an older one would win silently), a newest checkpoint whose files do not read, and a record file
    that could not be cut at the checkpoint (``record_problems``). Each names the file and what to
    do."""
    root = RunDir(run_dir).checkpoints
    out, marks = record_problems(run_dir), []
    for d in sorted(root.glob("step_*")) if root.is_dir() and not root.is_symlink() else []:
        marker = d / MARKER
        if (_NAME.fullmatch(d.name) and d.is_dir() and not d.is_symlink() and marker.is_file()
                and not marker.is_symlink()):
            why = _marker_problem(marker)
            if why:
                v = _NAME.fullmatch(d.name).group(1)
                marks.append(f"{marker}: unreadable ({why}). If {d.name} is complete, write "
                             f'{{"version": {v}}} into it; else move {d} out of checkpoints/ to '
                             "resume from the checkpoint before it")
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None or marks:
        return out + marks
    version = int(_NAME.fullmatch(ckpt.name).group(1))
    fix = (f"move {ckpt} out of checkpoints/ to resume from the checkpoint before it, or start a "
           "new run")
    for name, check in (("controller.json", _controller_state), ("trainer.json", _trainer_meta),
                        ("buffer.msgpack", _buffer), ("trainer/.metadata", _exists),
                        ("rng_rank0.pt", _exists)):
        why = check(ckpt / name, version)
        if why:
            out.append(f"{ckpt / name}: {why}; {fix}")
    return out


def _read_json_object(path: Path) -> dict:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _controller_state(path: Path, version: int) -> str | None:
    try:
        state = _read_json_object(path)
    except (OSError, ValueError) as err:
        return f"unreadable ({type(err).__name__}: {err})"
    missing = [k for k in ("version", "step", "next_group", "cursor", "groups") if k not in state]
    if missing:
        return f"lacks {missing}"
    return None if state["version"] == version else f"is of version {state['version']}"


def _trainer_meta(path: Path, version: int) -> str | None:
    try:
        meta = _read_json_object(path)
    except (OSError, ValueError) as err:
        return f"unreadable ({type(err).__name__}: {err})"
    return None if meta.get("version") == version else f"is of version {meta.get('version')!r}"


def _buffer(path: Path, version: int) -> str | None:
    import msgpack

    try:
        frames = msgpack.unpackb(path.read_bytes())
    except (OSError, ValueError, msgpack.UnpackException) as err:
        return f"unreadable ({type(err).__name__}: {err})"
    return None if isinstance(frames, list) else "not a list of buffered groups"


def _exists(path: Path, version: int) -> str | None:
    return None if path.is_file() else "missing"

"""Writes that a kill, a crash or a full disk cannot leave half done.

- ``atomic_write``: every small file of a run (config.yaml, endpoints.json, controller state,
  pids.json ...) is written to a temporary file beside it, fsynced, renamed over the target and the
  directory fsynced: a reader sees the old file or the new one, never a mix. The rename replaces a
  symbolic link at the target instead of writing through it.
- ``append_jsonl``: each row is one ``write(2)`` of a whole line to a file opened ``O_APPEND`` and
  ``O_NOFOLLOW``; ``fsync=True`` (at checkpoints) makes the rows so far durable.
- ``read_jsonl``: the rows of a JSONL file; a torn last line (a kill mid-write) is dropped and
  reported, a bad line anywhere else is an error naming it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new entry in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` all at once (temp file, fsync, rename, fsync the
    directory)."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def append_jsonl(path: str | Path, rows: list[dict], fsync: bool = False) -> None:
    """Append ``rows`` (one JSON object a line), each line written whole in one write."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    try:
        for row in rows:
            line = (json.dumps(row) + "\n").encode()
            written = os.write(fd, line)
            if written != len(line):  # a full disk: the torn line is dropped on resume
                raise OSError(f"{path}: wrote {written} of {len(line)} bytes (disk full?)")
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    """Flush what was appended to ``path`` to disk (nothing when it does not exist)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TornFile(ValueError):
    """A JSONL file with a bad line that is not its last one: damage, not an interrupted write."""


def read_jsonl(path: str | Path) -> tuple[list[dict], bool]:
    """The rows of ``path`` and whether a torn last line was dropped; [] when it does not exist."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return [], False
    lines = text.split("\n")
    rows, torn = [], False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        last = i == len(lines) - 1  # no newline after it: the write did not finish
        try:
            rows.append(json.loads(line))
        except ValueError:
            if last:
                torn = True
                continue
            raise TornFile(f"{path}: line {i + 1} is not JSON; the file is damaged "
                           "(restore it, or cut it before that line)") from None
        if last:  # valid JSON but no newline: a row whose write was cut after its last byte
            torn = True
            rows.pop()
    return rows, torn


def rewrite_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Replace a JSONL file with ``rows`` atomically."""
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows))

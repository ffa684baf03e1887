"""The controller's part of a checkpoint, and resume.

A checkpoint of version v is the directory ``checkpoints/step_<v>``. The trainer writes its
part into ``step_<v>.partial/`` and reports it with "step done"; the controller — which has
not sent batch v yet, so its state is exactly "v batches trained" — adds its part and renames
the directory: a directory without ``.partial`` is complete by construction, and resume only
ever picks those, and only with the run's marker (``checkpoints.MARKER``): a user's directory or a
symbolic link named like a checkpoint is never picked, followed or pruned.

Before the rename, metrics.jsonl and trajectories.jsonl are fsynced, so a complete checkpoint
never points past the rows on disk; resume drops a torn last row (a kill mid-write) and says so.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import msgpack

from areal_cli.checkpoint_dirs import MARKER, latest_checkpoint, marker_text, run_checkpoints
from areal_cli.durable import atomic_write, fsync_dir, fsync_file, read_jsonl, rewrite_jsonl
from areal_cli.rundir import RunDir
from areal_cli.tasks import Problem
from areal_cli.transport.messages import decode, encode

log = logging.getLogger(__name__)


def finish_checkpoint(ctl, partial: Path, version: int) -> None:
    groups, buffer = dict(ctl.groups), list(ctl.buffer)
    if ctl.step > version and ctl.last_batch and ctl.last_batch[0] == version:
        # batch `version` was sent but not trained: it belongs to the buffer of this checkpoint
        _, sent, entries = ctl.last_batch
        buffer = sent + buffer
        groups.update({g.group_id: e for g, e in zip(sent, entries, strict=True)})
    state = {
        "version": version, "step": version, "next_group": ctl.next_group,
        "cursor": ctl.cursor.state(),
        "groups": {str(g): [s, pid, p.to_dict()] for g, (s, pid, p) in groups.items()},
        "filtered_groups": ctl.rec.filtered_groups, "stale_dropped": ctl.rec.stale_dropped,
        "stale_dropped_tokens": ctl.rec.stale_dropped_tokens,
        "stale_stopped": ctl.rec.stale_stopped,
    }
    atomic_write(partial / "buffer.msgpack", msgpack.packb([encode(g) for g in buffer]))
    atomic_write(partial / "controller.json", json.dumps(state))
    # this run wrote it: resume may pick it, keep may prune it
    atomic_write(partial / MARKER, marker_text(version))
    for path in RunDir(ctl.run_dir).records:
        fsync_file(path)
    final = partial.with_name(partial.name.removesuffix(".partial"))
    publish(partial, final)
    _prune(final.parent, ctl.cfg.checkpoint.keep)


def publish(partial: Path, final: Path) -> None:
    """Rename a finished ``.partial`` directory to ``final``. A complete checkpoint of the same
    version already there (a resume stopped before its first new step) is kept: it is as good,
    and replacing it would leave a moment with none."""
    if final.is_symlink():
        raise RuntimeError(f"{final} is a symbolic link; areal does not write through links in a "
                           "run directory: remove it")
    if final.exists() and (final / "controller.json").is_file():
        log.info("%s is already complete: keeping it, dropping %s", final, partial.name)
        shutil.rmtree(partial)
        return
    if final.exists():  # an incomplete leftover without controller.json: never picked by resume
        shutil.rmtree(final)
    os.replace(partial, final)
    fsync_dir(final.parent)


def _prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints the run wrote (never a user's directory)."""
    done = run_checkpoints(root)
    for _, d in done[:-keep] if keep > 0 else []:
        shutil.rmtree(d, ignore_errors=True)


def restore(ctl, run_dir: Path) -> None:
    """Continue from the newest complete checkpoint: buffered groups are kept (the staleness
    filter still applies when batches form), groups in flight at the crash are regenerated."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        ctl.log.info("no complete checkpoint in %s: starting from step 0", run_dir)
        truncate_records(run_dir, 0)
        return
    state = json.loads((ckpt / "controller.json").read_text())
    v = state["version"]
    ctl.step, ctl.next_group, ctl.adm.version = state["step"], state["next_group"], v
    ctl.cursor.load_state(state["cursor"])
    groups = {int(g): (s, pid, Problem.from_dict(p)) for g, (s, pid, p) in state["groups"].items()}
    ctl.buffer = [decode(f) for f in msgpack.unpackb((ckpt / "buffer.msgpack").read_bytes())]
    buffered = {g.group_id for g in ctl.buffer}
    ctl.groups = {g: groups[g] for g in buffered}
    for g, entry in groups.items():
        if g not in buffered:
            ctl.cursor.requeue(*entry)  # was generating at the crash: regenerate from the start
    ctl.adm.accepted, ctl.adm.running = len(ctl.buffer), 0
    ctl.rec.filtered_groups = state["filtered_groups"]
    ctl.rec.stale_dropped = state["stale_dropped"]
    # absent from older checkpoints
    ctl.rec.stale_dropped_tokens = state.get("stale_dropped_tokens", 0)
    ctl.rec.stale_stopped = state.get("stale_stopped", 0)
    # the waste warning counts this run's alone
    ctl.rec.stale_tokens_at_start = ctl.rec.stale_dropped_tokens
    truncate_records(run_dir, v)
    ctl.log.info("resumed from %s: version %d, %d buffered groups kept, %d regenerated", ckpt, v,
                 len(ctl.buffer), len(groups) - len(buffered))


def last_step(run_dir: Path) -> int:
    """The last step of metrics.jsonl (-1 when none): what the experiment trackers hold."""
    path = RunDir(run_dir).metrics
    if not path.is_file():
        return -1
    rows, _ = read_jsonl(path)
    return max((r["step"] for r in rows), default=-1)


def truncate_records(run_dir: Path, version: int) -> None:
    """Drop what was logged after the checkpoint (it will be trained and logged again) and a torn
    last line; each file is replaced atomically, never rewritten in place."""
    rd = RunDir(run_dir)
    keep = {rd.metrics: lambda r: r["step"] < version,
            rd.trajectories: lambda r: r["trained_version"] < version,
            rd.weight_updates: lambda r: r["version"] <= version}
    for path in rd.records:
        if not path.exists():
            continue
        rows, torn = read_jsonl(path)
        if torn:
            log.warning("%s: dropped a torn last line (the run was killed while writing it)", path)
        kept = [r for r in rows if keep[path](r)]
        if torn or len(kept) != len(rows):
            rewrite_jsonl(path, kept)

"""Each tracker's logs read back with its own library: TensorBoard's event reader, W&B's record
protocol buffers, MLflow's tracking client. W&B dropped its Python reader of ``.wandb`` files (the
Go core writes them), so the framing (LevelDB's log format behind a 7-byte W&B header) is read
here; every record in it is decoded by wandb's own ``Record`` message."""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path

import pytest

BLOCK = 32768  # LevelDB log blocks
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def tensorboard_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    """tag → {step: value}, after TensorBoard's own purge of steps a resume logged again."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def tensorboard_accumulator(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def wandb_records(path: Path):
    """The ``wandb_internal_pb2.Record`` messages of one offline ``run-<id>.wandb`` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is no W&B transaction log"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_runs(run_dir: Path) -> list[dict]:
    """One dict per offline run directory, oldest first: id, history rows, summary, config keys."""
    out = []
    for f in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        run = {"id": None, "history": [], "summary": {}, "config": {}}
        for r in wandb_records(f):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                run["id"] = r.run.run_id
                run["config"].update({i.key: json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "history":
                run["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                       for i in r.history.item})
            elif kind == "summary":
                run["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                       for i in r.summary.update})
            elif kind == "config":
                run["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
        out.append(run)
    return out


def mlflow_client(run_dir: Path):
    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient((run_dir / "mlruns").resolve().as_uri())


@contextlib.contextmanager
def offline(home: Path):
    """No tracker touches the network or the user's home: W&B offline with its own directories,
    MLflow on a file store."""
    with pytest.MonkeyPatch.context() as mp:
        for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            mp.setenv(key, str(home))
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        yield

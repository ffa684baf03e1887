"""Trainer rank 0 shares each batch (or a stop, or "still waiting") with the other ranks as tensors
(two gloo processes).
Before: ``broadcast_object_list``, which unpickles whatever rank 0 sends."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from areal_cli.runtime import exit_now
from areal_cli.transport.messages import Batch, GroupResult, Sample, Stop
from areal_cli.transport.ranks import share_message


def batch() -> Batch:
    s = Sample(0, np.arange(5, dtype=np.int32), np.arange(300_000, dtype=np.int32),
               np.full(300_000, -0.5, np.float32), np.zeros(300_000, np.int32),
               np.ones(300_000, np.uint8),
               1.0, "ok", "stop", 1, "é" * 1000)
    return Batch(4, [GroupResult(9, "p", 0, [s, s], 0.1, 2)])


def _rank(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)

    def no_pickles(*a, **k):
        raise AssertionError("a pickle crossed between ranks")

    dist.broadcast_object_list = no_pickles  # a tripwire: nothing below may take this path
    cpu = torch.device("cpu")
    sent = [None, batch(), Stop()]  # still waiting, a batch, a stop
    got = [share_message(m if rank == 0 else Stop(), cpu) for m in sent]
    if rank == 1:
        ok = got[0] is None and isinstance(got[2], Stop) and isinstance(got[1], Batch)
        b = got[1]
        ok = ok and b.step == 4 and np.array_equal(b.groups[0].samples[1].logprobs,
                                                   batch().groups[0].samples[1].logprobs)
        open(out, "w").write("ok" if ok else f"mismatch: {[type(m).__name__ for m in got]}")
    dist.destroy_process_group()
    exit_now(0)  # as every areal process ends: no interpreter teardown beside a gloo thread


def test_batch_reaches_every_rank_as_tensors(tmp_path):
    out = tmp_path / "rank1.txt"
    mp.spawn(_rank, args=(f"file://{tmp_path / 'store'}", str(out)), nprocs=2, join=True)
    assert out.read_text() == "ok"

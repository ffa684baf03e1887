"""Stats reduced over two CPU trainer ranks (gloo, two processes): a rank with no fresh token
adds nothing to the behaviour-vs-trainer gap.

Before: that rank gave ``logp_gap_sum`` and ``fresh_tokens`` one shared zero tensor and the
in-place all-reduce added the fresh-token count into the gap sum, so the reported mean
|difference| was exactly 1.0 too high with ``trainer.ranks=2``."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from areal_cli.runtime import exit_now
from areal_cli.trainer.batching import reduce_stats


def _aliased(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    zero = torch.zeros(())
    gap = {"logp_gap_sum": torch.tensor(0.5), "fresh_tokens": torch.tensor(4.0)} if rank == 0 else \
        {"logp_gap_sum": zero, "fresh_tokens": zero}  # the same tensor under two keys
    got = reduce_stats({**gap, "clip_fraction": torch.tensor(float(rank))},
                       {"clip_fraction": "max"}, 1.0,
                       torch.device("cpu"))
    if rank == 0:
        open(out, "w").write(json.dumps(got))
    dist.destroy_process_group()
    exit_now(0)  # as every areal process ends: no interpreter teardown beside a gloo thread


def test_aliased_stats_are_reduced_each_once(tmp_path):
    out = tmp_path / "rank0.json"
    mp.spawn(_aliased, args=(f"file://{tmp_path / 'store'}", str(out)), nprocs=2, join=True)
    got = json.loads(out.read_text())
    # rank 0: 0.5 over 4 tokens, rank 1: nothing → 0.5 and 4 (the bug gave 4.5 and 4)
    assert got == {"logp_gap_sum": 0.5, "fresh_tokens": 4.0, "clip_fraction": 1.0}


def _step(rank: int, init: str, model: str, out: str) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import config, make_batch, plain_model

    from areal_cli.trainer.model import build_policy
    from areal_cli.trainer.step import StepRunner

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    batch = make_batch(plain_model(model), groups=2, group_size=2, seed=1, rewards=[1, 0, 1, 1])
    # rows 2, 3 (rank 1's shard) got one reward each: zero advantage, skipped, no fresh token there
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    runner = StepRunner.build(build_policy(model, cpu, torch.float32, False), model,
                              config("algorithm=grpo"), cpu,
                              torch.float32, rank=rank, world=2)
    stats = runner.train(batch, version=0)
    if rank == 0:
        open(out, "w").write(json.dumps({k: stats[k]
                                         for k in ("logp_gap_fresh", "fresh_tokens",
                                                   "skipped_rows")}))
    dist.destroy_process_group()
    exit_now(0)  # as every areal process ends: no interpreter teardown beside a gloo thread


def test_gap_of_two_ranks_counts_only_fresh_tokens(tmp_path, tiny_model):
    out = tmp_path / "rank0.json"
    mp.spawn(_step, args=(f"file://{tmp_path / 'store'}", str(tiny_model), str(out)), nprocs=2,
             join=True)
    got = json.loads(out.read_text())
    assert got["skipped_rows"] == 2 and got["fresh_tokens"] > 0
    # behaviour logprobs are the model's own (float32, unpadded): the gap is rounding only
    assert got["logp_gap_fresh"] < 1e-3, got

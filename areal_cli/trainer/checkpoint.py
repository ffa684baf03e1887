"""The trainer's part of a checkpoint: model and optimizer as a torch distributed checkpoint
(every rank writes its shards), LR schedule, step and RNG states. See controller/state.py for
how the directory becomes complete."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save(runner, version: int, partial: Path) -> Path:
    """Write this rank's part of checkpoint ``version`` into ``partial`` (RunDir.partial_checkpoint)."""
    if dist.get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dist.barrier()
    msd, osd = get_state_dict(runner.model, runner.opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(partial / "trainer"))
    torch.save({"torch": torch.get_rng_state()}, partial / f"rng_rank{dist.get_rank()}.pt")
    if dist.get_rank() == 0:
        (partial / "trainer.json").write_text(json.dumps({"version": version,
                                                         "sched": runner.sched.state_dict()}))
    dist.barrier()
    return partial


def load(runner, ckpt: Path) -> int:
    """Restore model, optimizer, schedule and RNG; returns the checkpoint's version."""
    msd, osd = get_state_dict(runner.model, runner.opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(ckpt / "trainer"))
    set_state_dict(runner.model, runner.opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    meta = json.loads((ckpt / "trainer.json").read_text())
    runner.sched.load_state_dict(meta["sched"])
    rng = ckpt / f"rng_rank{dist.get_rank()}.pt"
    if rng.exists():
        torch.set_rng_state(torch.load(rng)["torch"])
    return int(meta["version"])

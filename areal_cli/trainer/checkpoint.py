"""The trainer's part of a checkpoint: model and optimizer as a torch distributed checkpoint
(every rank writes its shards), LR schedule, step and RNG states. With LoRA the model part is the
adapter alone (frozen base weights are not written: the run's model is their source), and rank 0
also writes the adapter in peft's format to ``adapter/``. See controller/state.py for how the
directory becomes complete."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict


def _options(runner) -> StateDictOptions:
    """Frozen parameters (LoRA's base weights) stay out of the checkpoint; loading it sets the rest
    (not strict about the frozen ones: dcp.load already failed if an adapter tensor were
    missing)."""
    lora = runner.cfg.trainer.lora.rank > 0
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


def save(runner, version: int, partial: Path) -> Path:
    """Write this rank's part of checkpoint ``version`` into ``partial``
    (RunDir.partial_checkpoint)."""
    if dist.get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dist.barrier()
    msd, osd = get_state_dict(runner.model, runner.opt, options=_options(runner))
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(partial / "trainer"))
    if runner.cfg.trainer.lora.rank > 0:
        _save_adapter(runner, partial / "adapter")
    torch.save({"torch": torch.get_rng_state()}, partial / f"rng_rank{dist.get_rank()}.pt")
    if dist.get_rank() == 0:
        (partial / "trainer.json").write_text(json.dumps({"version": version,
                                                         "sched": runner.sched.state_dict()}))
    dist.barrier()
    return partial


def load(runner, ckpt: Path) -> int:
    """Restore model, optimizer, schedule and RNG; returns the checkpoint's version."""
    options = _options(runner)
    msd, osd = get_state_dict(runner.model, runner.opt, options=options)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(ckpt / "trainer"))
    set_state_dict(runner.model, runner.opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=options)
    meta = json.loads((ckpt / "trainer.json").read_text())
    runner.sched.load_state_dict(meta["sched"])
    rng = ckpt / f"rng_rank{dist.get_rank()}.pt"
    if rng.exists():
        torch.set_rng_state(torch.load(rng)["torch"])
    return int(meta["version"])


def _save_adapter(runner, out: Path) -> None:
    """The adapter in peft's format (rank 0; every rank gathers)."""
    from areal_cli.lora import adapter_items, is_adapter, save_adapter
    from areal_cli.trainer.model import full_parameters

    items = dict(adapter_items(full_parameters(runner.model, only=is_adapter)))
    if dist.get_rank() == 0:
        save_adapter(out, iter(items.items()), runner.cfg.trainer.lora, runner.cfg.model)

"""How trainer rank 0 and the rollout worker on its GPU share the card (``cluster.share``), planned
before anything starts.

``concurrent``: both hold their memory for the whole run and compute at once; generation is held
only for the weight swap. ``alternate``: the worker stops and its engine sleeps (vLLM frees its KV
cache and moves its weights to host memory) while the trainer steps, and wakes for each update; the
trainer may then use the card less what the sleeping engine keeps (``EngineSpec.asleep_bytes``).
``auto`` takes concurrent where the trainer's estimate fits beside the engine's share, else
alternate where the engine can sleep.
"""

from __future__ import annotations

import copy
import dataclasses

from areal_cli.config.choices import Share, Switch
from areal_cli.config.resolve import Placement, checkpointing, resident
from areal_cli.config.schema import RootConfig
from areal_cli.engines import spec
from areal_cli.runconfig.autos import resolve

GIB = 1024 ** 3


def choose_share(asked: RootConfig, cfg: RootConfig, placement: Placement,
                 total: int) -> tuple[RootConfig, Placement]:
    """``(cfg, placement)`` for the mode ``asked.cluster.share`` names or ``auto`` picks on a card
    of ``total`` bytes: ``cfg`` resolved for ``placement`` (the concurrent one) as it comes, else
    both again for the trainer's memory while the engine sleeps."""
    want, engine = asked.cluster.share, spec(cfg.engine.name)
    if want == Share.concurrent or (want == Share.alternate and engine.asleep_bytes < 0):
        return cfg, placement  # an engine that cannot sleep keeps its share (share_notes says so)
    if want == Share.auto:
        _, need = checkpointing(cfg, placement)
        if need <= placement.gpu_memory_bytes or engine.asleep_bytes < 0:
            return cfg, placement  # fits beside it (or not known here, or nothing to gain)
    wide = dataclasses.replace(placement, gpu_memory_bytes=total - engine.asleep_bytes)
    asked = copy.deepcopy(asked)
    # no generation while an update arrives: nothing to stage behind, on either side (the
    # trainer's staged wire copy would sit beside the woken engine)
    asked.engine.vllm.staging = False
    if asked.weights.staged == Switch.auto:
        asked.weights.staged = Switch.false
    out = resolve(asked, wide)
    out.cluster.share = Share.alternate
    return out, wide


def share_notes(cfg: RootConfig, placement: Placement, total: int, gpu: int) -> list[str]:
    """How trainer rank 0 and the rollout worker on its GPU ``gpu`` of ``total`` bytes share it
    (``cfg`` and ``placement`` as ``choose_share`` made them); ValueError naming what to lower
    where the estimate does not fit."""
    engine = spec(cfg.engine.name)
    awake = total - engine.shared_card(cfg, total, placement.model_path)  # its share and beside it
    every, need = checkpointing(cfg, placement)
    what = ("no checkpointing" if every is None
            else f"checkpointing every {'' if every == 1 else f'{every}th '}layer")
    alternate = cfg.cluster.share == Share.alternate
    name = cfg.engine.name
    head = (f"GPU {gpu} ({total / GIB:.0f} GiB) shared by trainer rank 0 and rollout-0 "
            f"(engine={name}), ")
    if not alternate:
        head += ("concurrent: generation goes on while the trainer steps; the only hold is the "
                 "weight swap")
    elif engine.asleep_bytes < 0:
        head += (f"alternate: rollout-0 stops while the trainer steps ({name} cannot sleep: it "
                 "keeps its share)")
    else:
        head += (f"alternate: {name} sleeps while the trainer steps (its KV cache freed, its "
                 f"weights in host memory; ~{engine.asleep_bytes / GIB:.0f} GiB kept) and wakes "
                 "for each update")
    lines = [head, f"  {name}: {awake / GIB:.1f} GiB awake "
                   f"({engine.share_why(cfg, placement.model_path)})"]
    room = placement.gpu_memory_bytes
    where = "while it sleeps" if alternate and engine.asleep_bytes >= 0 else "left"
    if not need:
        return [*lines, f"  trainer rank 0: the rest, {room / GIB:.1f} GiB {where} (the model's "
                        "layout is not known here to estimate its peak)"]
    lines.append(f"  trainer rank 0: ~{need / GIB:.1f} GiB estimated ({what}, "
                 f"micro_batch_tokens={cfg.trainer.micro_batch_tokens}) of the "
                 f"{room / GIB:.1f} GiB {where}")
    if need > room:
        raise ValueError("\n  ".join([f"trainer rank 0 and rollout-0 do not fit on GPU {gpu} "
                                      "together:", *lines, *_fixes(cfg, alternate)]))
    if alternate and engine.asleep_bytes >= 0:
        kept = resident(cfg, placement)
        lines.append(f"  at each update {name} wakes beside the trainer's ~{kept / GIB:.1f} GiB "
                     "kept between steps (weights and optimizer state; gradients freed)")
        if kept + awake > total:
            fit = (total - kept) / total
            raise ValueError("\n  ".join([
                f"trainer rank 0 and rollout-0 do not fit on GPU {gpu} when {name} wakes for an "
                "update:", *lines,
                f"lower engine.gpu_memory_utilization to {fit:.2f} or less (now "
                f"{cfg.engine.gpu_memory_utilization:g}); or use trainer.optim_state=bfloat16, "
                "a LoRA adapter (trainer.lora.rank=16) or a GPU with more memory"]))
    return lines


def _fixes(cfg: RootConfig, alternate: bool) -> list[str]:
    t = cfg.trainer
    lower = [f"trainer.micro_batch_tokens (now {t.micro_batch_tokens})"]
    use = []
    if not alternate:
        share = cfg.engine.gpu_memory_utilization
        lower.insert(0, f"engine.gpu_memory_utilization (now {share:g})")
        use.append("cluster.share=alternate (the engine sleeps while the trainer steps)")
    if t.optim_state != "bfloat16":
        use.append("trainer.optim_state=bfloat16 (Adam's moments in half the memory)")
    use.append("a LoRA adapter (trainer.lora.rank=16) instead of every weight" if t.lora.rank <= 0
               else "a GPU with more memory")
    return ["lower " + ", ".join(lower) + "; or use " + "; or ".join(use)]

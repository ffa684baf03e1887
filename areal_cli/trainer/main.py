"""Trainer rank (under torchrun): FSDP2 policy, decoupled PPO step, weight broadcast.

``torchrun --nproc-per-node T -m areal_cli.trainer.main <run_dir>``. Rank 0 receives each
batch from the controller and shares it with the other ranks; after each optimizer step
every rank gathers full parameters and rank 0 broadcasts them to the rollout workers.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import math
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import zmq

from areal_cli import faults
from areal_cli.config.read import read_yaml
from areal_cli.config.resolve import require_resolved
from areal_cli.durable import atomic_write
from areal_cli.engines.factory import make_sender
from areal_cli.model_source import resolve_model
from areal_cli.rundir import RunDir
from areal_cli.runtime import StatusLink, run_main, set_threads, setup_process
from areal_cli.trainer.model import (
    build_policy,
    full_parameters,
    policy_options,
    save_hf,
    zero_row_starts,
)
from areal_cli.trainer.step import StepRunner
from areal_cli.transport.auth import load_keys
from areal_cli.transport.channels import Channel, Endpoints, max_frame_bytes
from areal_cli.transport.messages import (
    Batch,
    Bye,
    CheckpointWritten,
    Hello,
    Phase,
    StepDone,
    Stop,
    WeightsReady,
    encode,
)
from areal_cli.transport.ranks import share_message

log = logging.getLogger(__name__)


def init_ranks(backend: str, timeout: datetime.timedelta) -> None:
    """The trainer ranks' default group. One CPU rank (``AREAL_SINGLE_RANK``, started without
    torchrun) is a group of itself; ranks of a local run meet in ``AREAL_RANKS_STORE``, a FileStore
    in the 0700 run directory (no store listens on a port); otherwise torchrun's store (Slurm)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if os.environ.get("AREAL_SINGLE_RANK") == "1":  # started without torchrun (launcher/plan.py)
        store = dist.HashStore()
    elif os.environ.get("AREAL_RANKS_STORE"):
        store = dist.FileStore(os.environ["AREAL_RANKS_STORE"], world)
    else:
        dist.init_process_group(backend, timeout=timeout)
        return
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


class Trainer:
    def __init__(self, run_dir: str):
        self.run_dir = Path(run_dir)
        self.rd = RunDir(run_dir)
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.name = f"trainer-{self.rank}"
        redirect_output(self.rd.log(self.name))
        self.log = setup_process(self.name, run_dir)
        # resolved when the run was planned: read here, never resolved or changed
        self.cfg = cfg = require_resolved(read_yaml(self.rd.config), str(self.rd.config))
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        self.device = torch.device("cuda",
                                   torch.cuda.current_device()) if cuda else torch.device("cpu")
        # a rank stuck in a collective is an error after launcher.peer_timeout_s, not a hang
        init_ranks("nccl" if cuda else "gloo",
                   datetime.timedelta(seconds=cfg.launcher.peer_timeout_s))
        set_threads(cfg.trainer.threads)
        torch.manual_seed(cfg.seed)
        ep = Endpoints.load(run_dir)
        keys, limit = (load_keys(run_dir), max_frame_bytes(cfg)) if self.rank == 0 else (None, 0)
        # rank 0's status channel to the controller (other ranks talk only to rank 0)
        self.status = StatusLink(ep, keys, self.name, cfg.launcher.heartbeat_s,
                                 limit) if self.rank == 0 else None
        self._doing("loading the model")
        self.model_path = resolve_model(cfg.model)
        dtype = getattr(torch, cfg.trainer.dtype)
        options = policy_options(cfg)
        if self.rank == 0:
            self.log.info("trainer: %s, micro_batch_tokens %d, logprob_chunk_tokens %d", options,
                          cfg.trainer.micro_batch_tokens, cfg.trainer.logprob_chunk_tokens)
        self.model = build_policy(self.model_path, self.device, dtype, **options)
        if cfg.trainer.lora.rank > 0:
            trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            total = sum(p.numel() for p in self.model.parameters())
            self.log.info("LoRA rank %d: %.2fM trainable parameters of %.1fM (%.2f%%)",
                          cfg.trainer.lora.rank,
                          trainable / 1e6, total / 1e6, 100 * trainable / total)
        self.runner = StepRunner.build(self.model, self.model_path, cfg, self.device, dtype,
                                       self.rank,
                                       self.world)
        self.sender = None
        self.stop_requested = False
        self.nonfinite_streak = 0  # steps in a row with a non-finite gradient norm
        self.zero_rows_warned: set[int] = set()
        if self.rank == 0:
            self.batches = Channel(zmq.PULL, ep.batches, bind=False, name="batches", keys=keys,
                                   max_frame=limit)
            self._doing("waiting for the rollout workers to join the weight broadcast group")
            # the sender of the run's engine (areal's bucketed broadcast, or vLLM's own NCCL
            # transfer)
            self.sender = make_sender(cfg, ep.weights_host, ep.weights_port, self.model,
                                      self.device, ep.weights_store)
            self.status.send(Hello(self.name))
        self.log.info("ready: %d rank(s), device %s", self.world, self.device)

    def _doing(self, what: str, phase: Phase = Phase.other, version: int = -1) -> None:
        if self.status is not None:
            self.status.set_doing(what, phase, version)

    def _receive_batch(self, step: int):
        """The next batch, shared with every rank; None when a stop was requested (SIGTERM).

        Rank 0 waits for the controller in slices and tells the other ranks "still waiting"
        between them, so no rank sits in one collective longer than a slice: a collective
        that exceeds launcher.peer_timeout_s is then a real stall, reported as an error.
        Rank 0 shares a ``Batch``, a ``Stop`` or nothing (still waiting): the ranks channel's
        messages, as tensors (their msgpack frame), never pickled."""
        while True:
            msg = None
            if self.rank == 0:
                self._doing(f"waiting for batch {step} from the controller")
                msg = self.batches.recv(5.0)
                if msg is not None and msg.step != step:
                    self.log.warning("dropped batch %d: step %d is next", msg.step, step)
                    msg = None
                if msg is None and self.stop_requested:
                    msg = Stop()
            if self.world > 1:
                msg = share_message(msg, self.device)
            if isinstance(msg, Stop):
                return None
            if isinstance(msg, Batch):
                return msg

    def _on_signal(self, signum, _frame) -> None:
        self.log.info("signal %d: stopping after the current step", signum)
        self.stop_requested = True

    def _resume(self) -> int:
        from areal_cli.checkpoint_dirs import latest_checkpoint
        from areal_cli.trainer import checkpoint

        ckpt = latest_checkpoint(Path(self.cfg.resume)) if self.cfg.resume else None
        if ckpt is None:
            return 0
        self._doing(f"loading checkpoint {ckpt}")
        version = checkpoint.load(self.runner, ckpt)
        self.log.info("resumed from %s (version %d)", ckpt, version)
        self._doing(f"sending the resumed weights (version {version})")
        self._sync_weights(version)
        return version

    def _checkpoint(self, version: int, kind: str) -> None:
        """Write this rank's part of checkpoint ``version``; the controller completes it on
        ``StepDone`` / ``CheckpointWritten`` (it derives the directory from the version itself)."""
        from areal_cli.trainer import checkpoint

        self._doing(f"writing checkpoint of version {version}")
        checkpoint.save(self.runner, version, self.rd.partial_checkpoint(version))
        if self.rank == 0 and kind == "checkpoint":
            self.status.send(CheckpointWritten(self.name, version))

    def _eval_due(self, version: int) -> bool:
        e = self.cfg.eval
        return bool(e.every and version % e.every == 0)

    def _evaluate(self, version: int) -> dict:
        """Greedy accuracy on the held-out split with the weights of ``version`` (rank 0 runs it;
        every rank takes part in gathering the checkpoint it reads)."""
        self._doing(f"evaluating version {version}")
        path = self.rd.eval_checkpoint
        save_hf(self.model, self.model_path, path, lora=self.cfg.trainer.lora)
        out = {}
        if self.rank == 0:
            from areal_cli.eval import evaluate

            res = evaluate(path, self.cfg.task, self.cfg.reward.verifier(), n_samples=1,
                           temperature=0.0,
                           max_new_tokens=self.cfg.rollout.max_new_tokens, size=self.cfg.eval.size)
            name = self.cfg.task.name
            out = {f"eval/{name}/{k}": v for k,
                   v in res["metrics"].items() if isinstance(v, (int, float))}
            self.log.info("eval at version %d: %s", version, out)
        dist.barrier()
        return out

    def _warn_skipped(self, step: int, metrics: dict, kept: Path | None = None) -> None:
        """Say so when this step's optimizer step was skipped for a non-finite gradient norm (the
        weights did not move); counted in ``skipped_steps``. ``kept``: where its batch was kept for
        a replay."""
        norm = metrics.get("grad_norm")
        if isinstance(norm, float) and not math.isfinite(norm):
            where = getattr(getattr(self, "runner", None), "nonfinite", [])
            self.log.warning("step %d: gradient norm %s: the optimizer step was skipped and the "
                             "weights did not change (%d step(s) skipped so "
                             "far)%s%s", step, norm, metrics.get("skipped_steps", 0),
                             f"; non-finite gradients in {', '.join(where)}" if where else "",
                             f"; the step's batch is kept in {kept} (replay it on the trainer "
                             "alone: python -m benchmarks.trainer_profile --arch MODEL_DIR "
                             f"--batch {kept} --grad-probe)" if kept else "")

    def _warn_zero_rows(self, step: int, batch) -> None:
        """Once per token id: sequences of this batch start with a token whose embedding row is all
        zero."""
        starts = zero_row_starts(batch, getattr(self.model, "zero_embedding_rows", frozenset()))
        for tok in sorted(set(starts) - self.zero_rows_warned):
            self.zero_rows_warned.add(tok)
            self.log.warning("step %d: %d sequence(s) start with token id %d, whose embedding row "
                             "in %s is all zero: such a sequence keeps a zero hidden state through "
                             "the layers and its gradient can grow by up to 1/sqrt(rms_norm_eps) "
                             "per layer to NaN; give that row values (a trained or initialised "
                             "embedding) or start the prompts with another token",
                             step, starts[tok], tok, self.model_path)

    def _stop_on_nonfinite(self, step: int, metrics: dict) -> None:
        """Raise once ``trainer.max_nonfinite_steps`` steps in a row had a non-finite gradient norm
        (every rank sees the same all-reduced norm, so all of them stop at the same step)."""
        self.nonfinite_streak = nonfinite_streak(self.nonfinite_streak, metrics, self.cfg.trainer)
        limit = self.cfg.trainer.max_nonfinite_steps
        if limit and self.nonfinite_streak >= limit:
            where = getattr(getattr(self, "runner", None), "nonfinite", [])
            raise RuntimeError(
                f"steps {step - limit + 1}-{step}: the gradient norm was not finite in {limit} "
                "steps in a row (each skipped: the weights have not moved in those "
                f"steps){'; in ' + ', '.join(where) if where else ''}. Run one step with "
                "trainer.detect_anomaly=true to name the operation where it starts; "
                "trainer.max_nonfinite_steps=0 lets the run go on")

    def _due(self, version: int) -> bool:
        every = self.cfg.checkpoint.every
        return bool(every) and version % every == 0 and version < self.cfg.trainer.steps

    def run(self) -> None:
        cfg = self.cfg
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        start = self._resume()
        if start < cfg.trainer.steps:
            self._precompile()
        for step in range(start, cfg.trainer.steps):
            batch = self._receive_batch(step)
            if batch is None:
                if cfg.checkpoint.on_signal:
                    self._checkpoint(step, "checkpoint")
                return self._finish(save_final=False)
            self._doing(f"training step {step}")
            if self.rank == 0:
                self._warn_zero_rows(step, batch)
            faults.point("train", step, self.run_dir)
            t0 = time.perf_counter()
            metrics = self.runner.train(batch, version=step)
            metrics["step_time_s"] = time.perf_counter() - t0
            self._doing(f"sending weights of version {step + 1}", Phase.sending_weights, step + 1)
            metrics.update(self._sync_weights(step + 1))
            if self._eval_due(step + 1):
                metrics.update(self._evaluate(step + 1))
            saved = self._due(step + 1) or self._stop_agreed()
            if saved:
                self._checkpoint(step + 1, "step")
            if self.rank == 0:
                self.status.send(StepDone(self.name, step + 1, metrics, checkpoint=saved))
                self.log.info("step %d: reward %.3f loss %.4f (%.1fs train, %.2fs sync)", step,
                              float(batch_reward(batch)), metrics.get("loss", 0.0),
                              metrics["step_time_s"],
                              metrics.get("weight_sync_s", 0.0))
                if metrics.get("compiled_graphs"):
                    self.log.warning("step %d compiled %d graphs inside the step (a form of input "
                                     "the trainer's precompile did not "
                                     "foresee)", step, metrics["compiled_graphs"])
                kept = keep_nonfinite_batch(self.run_dir, step, batch, metrics, self.cfg.trainer)
                self._warn_skipped(step, metrics, kept)
            self._stop_on_nonfinite(step, metrics)
            if saved and self.stop_requested:
                return self._finish(save_final=False)
        self._finish(save_final=True)

    def _precompile(self) -> None:
        """The compiled layers' every form of input, compiled while the engines start and generate
        the first batch (``trainer/precompile.py``) instead of inside the steps that first meet
        them."""
        if not getattr(self.model, "compiled_head", False):
            return
        self._doing("compiling the policy's layers before the first batch")
        forms, seconds = self.runner.precompile()
        if self.rank == 0:
            self.log.info("compiled the policy's layers for %d forms of input (%s) in %.1fs",
                          len(forms),
                          ", ".join(forms), seconds)

    def _stop_agreed(self) -> bool:
        """Every rank learns whether any rank was asked to stop (a collective: all call it)."""
        if not self.cfg.checkpoint.on_signal:
            return False
        flag = torch.tensor([float(self.stop_requested)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.stop_requested = bool(flag.item())
        return self.stop_requested

    def _finish(self, save_final: bool) -> None:
        if save_final:
            self._doing("saving the final checkpoint")
            # the final checkpoint is weights only: the save's copies fit in its place
            self.runner.release_optimizer()
            save_hf(self.model, self.model_path, self.rd.final, lora=self.cfg.trainer.lora,
                    last=True)
        if self.rank == 0:
            self.status.send(Bye(self.name, finished=save_final))
            if save_final:
                self.log.info("checkpoint written to %s", self.rd.final)
        dist.barrier()
        dist.destroy_process_group()
        if self.sender is not None:
            self.sender.close()

    def _sync_weights(self, version: int) -> dict:
        """Gather the new weights into the wire buffers, then tell the controller they are
        ready (the rollout workers pause only now), then broadcast them."""
        params = update_items(self.model, self.cfg)
        if self.rank != 0:
            for _ in params:
                pass
            return {}
        out = self.sender.prepare(params)
        if self.cfg.cluster.share == "alternate" and self.device.type == "cuda":
            # the engine beside it wakes at this update: the gradients and the step's cached
            # blocks go back first
            self.runner.release_gradients()
            torch.cuda.empty_cache()
        self.status.send(WeightsReady(self.name, version))
        out.update(self.sender.broadcast(digest=self.cfg.weights.verify))
        out["weight_sync_s"] = out.get("weight_gather_s", 0.0) + out["weight_transfer_s"]
        return out


def update_items(model, cfg):
    """(name, full tensor) pairs of one weight update, in ``lora.update_specs`` order (a
    collective): every parameter; with LoRA the adapter alone, or the merged weights
    (engine.lora_merge)."""
    from areal_cli import lora

    if not lora.enabled(cfg):
        return full_parameters(model)
    if lora.sends_adapter(cfg):
        return lora.adapter_items(full_parameters(model, only=lora.is_adapter))
    return lora.merged_items(full_parameters(model), lora.scale(cfg.trainer.lora))


def redirect_output(path: Path) -> None:
    """Each rank writes its own logs/trainer-<rank>.log (torchrun's output is logs/trainer.log)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def nonfinite_streak(streak: int, metrics: dict, trainer) -> int:
    """Steps in a row with a non-finite gradient norm, after this step's ``metrics``; float16 runs
    (their loss scale finds its level through overflows) stay at 0."""
    norm = metrics.get("grad_norm")
    if str(trainer.dtype) == "float16" or not isinstance(norm, float) or math.isfinite(norm):
        return 0
    return streak + 1


KEEP_NONFINITE = 2
"""Batches of steps with a non-finite gradient norm kept in ``RUN_DIR/nonfinite/`` (the first
ones)."""
KEEP_NONFINITE_BYTES = 256 << 20
"""A larger batch (its wire frame) is not kept."""


def keep_nonfinite_batch(run_dir: Path, step: int, batch, metrics: dict, trainer) -> Path | None:
    """Write ``batch`` (its wire frame) to ``run_dir/nonfinite/batch_STEP.msgpack`` when this step's
    gradient norm was not finite, so that the step can be replayed with the same tokens, logprobs
    and rewards (``benchmarks/trainer_profile.py --batch``); at most ``KEEP_NONFINITE`` per run and
    ``KEEP_NONFINITE_BYTES`` each, none for float16 runs (their loss scale finds its level through
    overflows). The path, or None."""
    if not nonfinite_streak(0, metrics, trainer):
        return None
    where = Path(run_dir) / "nonfinite"
    if where.is_dir() and len(list(where.glob("batch_*.msgpack"))) >= KEEP_NONFINITE:
        return None
    frame = encode(batch)
    if len(frame) > KEEP_NONFINITE_BYTES:
        return None
    path = where / f"batch_{step}.msgpack"
    try:
        where.mkdir(exist_ok=True)
        atomic_write(path, frame, mode=0o600)
    except OSError as err:  # a full or read-only disk costs the replay, not the run
        log.warning("step %d: its batch could not be kept in %s (%s)", step, where, err)
        return None
    return path


def batch_reward(batch) -> float:
    rewards = [s.reward for g in batch.groups for s in g.samples]
    return sum(rewards) / max(1, len(rewards))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    args = ap.parse_args()
    Trainer(args.run_dir).run()


if __name__ == "__main__":
    run_main(main)

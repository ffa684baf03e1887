"""Controller: dataset cursor, staleness admission, rollout buffer, batches, metrics.

``python -m areal_cli.controller.main <run_dir>``. It binds every ZeroMQ socket of the run,
so it starts first. Its loop: admit groups while the rule allows → collect finished groups
→ when the trainer is ready and B groups are buffered, send the oldest B → on "weights of v
ready" tell the rollout workers to update → on "step done" log the step (and finish a
checkpoint). It also watches heartbeats: a peer silent for ``launcher.peer_timeout_s``, or
holding work without progress for ``launcher.progress_timeout_s`` (controller/liveness.py), ends
the run with its name and what it was doing. A non-finite reward is scored 0 and counted.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import numpy as np
import zmq

from areal_cli.config.load import load_yaml
from areal_cli.controller.admission import Admission
from areal_cli.controller.dataset import Cursor
from areal_cli.controller.liveness import ProgressWatch
from areal_cli.controller.records import StepRecorder, zero_nonfinite_rewards
from areal_cli.controller.state import finish_checkpoint, restore
from areal_cli.runtime import load_endpoints, run_main, setup_process
from areal_cli.tasks import Problem, build_messages, load_problems
from areal_cli.transport.channels import Channel, Router
from areal_cli.transport.messages import Batch, Control, GroupResult, WorkItem


class PeerStalled(RuntimeError):
    pass


def publish_endpoints(run_dir: Path, ep, bound: dict) -> None:
    """Write the addresses actually bound, then ``controller.ready`` (the launcher waits for it)."""
    import json

    from areal_cli.durable import atomic_write

    ep.work, ep.results, ep.batches = bound["work"], bound["results"], bound["batches"]
    ep.control, ep.status = bound["control"], bound["status"]
    atomic_write(run_dir / "endpoints.json", json.dumps(ep.to_dict(), indent=1))
    atomic_write(run_dir / "controller.ready", "ok\n")


class Controller:
    def __init__(self, run_dir: str):
        self.run_dir = Path(run_dir)
        self.log = setup_process("controller", run_dir)
        self.cfg = cfg = load_yaml(self.run_dir / "config.yaml")
        ep = load_endpoints(run_dir)
        if not cfg.launcher.port_base and cfg.launcher.name == "local":
            # bind where the OS says, then tell everyone (the local launcher starts the others
            # only once controller.ready exists; under Slurm the job's prepare step chose the ports)
            ep.work = ep.results = ep.batches = ep.control = ep.status = f"tcp://{cfg.launcher.host}:0"
        self.status = Router(ep.status)
        self.work = Channel(zmq.PUSH, ep.work, bind=True, name="work", hwm=4)
        self.results = Channel(zmq.PULL, ep.results, bind=True, name="results")
        self.batches = Channel(zmq.PUSH, ep.batches, bind=True, name="batches", hwm=2)
        self.control = Channel(zmq.PUB, ep.control, bind=True, name="control")
        publish_endpoints(self.run_dir, ep, {c.name: c.addr for c in (
            self.status, self.work, self.results, self.batches, self.control)})
        from transformers import AutoTokenizer

        from areal_cli.models import resolve_model

        self.tok = AutoTokenizer.from_pretrained(resolve_model(cfg.model))
        self.cursor = Cursor(load_problems(cfg.task, "train"), cfg.seed)
        total = cfg.rollout.max_concurrent or (cfg.rollout.max_staleness + 1) * cfg.trainer.batch_size
        self.adm = Admission(cfg.trainer.batch_size, cfg.rollout.max_staleness, total)
        self.buffer: list[GroupResult] = []  # finished, kept, not yet trained
        self.groups: dict[int, tuple[int, str, Problem]] = {}  # group_id → (seq, prompt_id, problem)
        self.next_group = 0
        self.step = 0  # next step to send
        self.trainer_ready = False
        self.rollouts_up: set[str] = set()
        self.pending_update: int | None = None
        self.peers = {f"rollout-{i}" for i in range(cfg.rollout.workers)} | {"trainer-0"}
        self.last_seen: dict[str, float] = {}
        self.doing: dict[str, str] = {}
        self.watch = ProgressWatch(cfg.launcher.progress_timeout_s)
        self.rec = StepRecorder(self.run_dir, cfg)
        self.last_batch = None  # (step, groups, entries) of the batch sent last
        self.done = False
        self.stopping = None  # monotonic time a stop signal arrived
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if cfg.resume:
            restore(self, Path(cfg.resume))

    def _on_signal(self, signum, _frame) -> None:
        # keep serving until the trainer has checkpointed and said bye (bounded in run())
        self.stopping = self.stopping or time.monotonic()

    # ---- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        self.log.info("waiting for %s", ", ".join(sorted(self.peers)))
        start = time.monotonic()
        while not self.done:
            if self.stopping and time.monotonic() - self.stopping > 60:
                self.log.warning("stop signal: the trainer did not finish within 60s")
                break
            self._admit()
            self._collect()
            self._maybe_send_batch()
            self._handle_status()
            self._check_peers(start)
        self.send_stop()
        self.log.info("run finished: %d steps", self.step)

    def send_stop(self) -> None:
        """Tell the rollout workers to stop. The process ends with os._exit right after, which drops
        what ZeroMQ's I/O thread has not sent yet: give it a moment, or a worker waits for a stop
        that never comes until the launcher kills it."""
        self.control.send(Control("stop"))
        time.sleep(0.5)

    def _admit(self) -> None:
        r = self.cfg.rollout
        while self.adm.can_admit():
            seq, pid, problem = self.cursor.next()
            text = self.tok.apply_chat_template(build_messages(problem, self.cfg.task),
                                                add_generation_prompt=True, tokenize=False)
            prompt = np.asarray(self.tok(text, add_special_tokens=False)["input_ids"], np.int32)
            item = WorkItem(self.next_group, pid, prompt, r.group_size, r.max_new_tokens, r.temperature,
                            r.top_p, problem.to_dict(), self.adm.version, self.cfg.seed + seq)
            if not self.work.try_send(item):
                self.cursor.requeue(seq, pid, problem)
                return  # every worker's queue is full; try again next turn
            self.groups[self.next_group] = (seq, pid, problem)
            self.adm.admit()
            self.next_group += 1

    def _collect(self) -> None:
        msg = self.results.recv(0.01)
        while msg is not None:
            self._on_result(msg)
            msg = self.results.recv(0)

    def _on_result(self, g: GroupResult) -> None:
        if g.group_id not in self.groups:
            self.log.warning("dropping a result for unknown group %d (from before a restart)", g.group_id)
            return
        bad = zero_nonfinite_rewards(g)
        if bad:
            self.log.warning("group %d (%s) from rollout-%d: %d non-finite reward(s) scored 0", g.group_id,
                             g.prompt_id, g.worker, bad)
        self.rec.on_group(g)
        rewards = [s.reward for s in g.samples]
        keep = not (self.cfg.algorithm.dynamic_sampling and max(rewards) == min(rewards))
        self.adm.finish(kept=keep)
        if keep:
            self.buffer.append(g)
        else:
            self.rec.filtered_groups += 1
            del self.groups[g.group_id]

    def _seq(self, g: GroupResult) -> int:
        return self.groups[g.group_id][0]

    def _maybe_send_batch(self) -> None:
        if not self.trainer_ready or self.step >= self.cfg.trainer.steps:
            return
        self._drop_stale()
        B = self.cfg.trainer.batch_size
        if len(self.buffer) < B:
            return
        self.buffer.sort(key=self._seq)
        if self.cfg.rollout.batch_order == "admission" and not self._oldest_finished(B):
            return
        batch, self.buffer = self.buffer[:B], self.buffer[B:]
        self.last_batch = (self.step, batch, [self.groups[g.group_id] for g in batch])
        self.batches.send(Batch(self.step, self.step, batch))
        self.watch.update("trainer-0", time.monotonic(), busy=True)
        self.rec.on_batch(self.step, batch)
        for g in batch:
            del self.groups[g.group_id]
        self.log.info("batch %d sent (%d groups buffered, %d running)", self.step, len(self.buffer),
                      self.adm.running)
        self.trainer_ready = False
        self.step += 1

    def _oldest_finished(self, B: int) -> bool:
        """admission order: the B oldest outstanding prompts must all be finished."""
        outstanding = sorted([s for s, _, _ in self.groups.values()] + [s for s, _, _ in self.cursor.requeued])
        return [self._seq(g) for g in self.buffer[:B]] == outstanding[:B]

    def _drop_stale(self) -> None:
        eta, kept = self.cfg.rollout.max_staleness, []
        for g in self.buffer:
            starts = [int(s.versions[s.loss_mask.astype(bool)][0]) for s in g.samples if s.loss_mask.any()]
            if starts and self.step - min(starts) > eta:
                self.adm.drop_accepted()
                self.rec.stale_dropped += 1
                self.cursor.requeue(*self.groups.pop(g.group_id))
            else:
                kept.append(g)
        self.buffer = kept

    def _handle_status(self) -> None:
        msg = self.status.recv(0)
        while msg is not None:
            self.last_seen[msg.sender] = now = time.monotonic()
            self.doing[msg.sender] = msg.doing or self.doing.get(msg.sender, "")
            if msg.kind == "heartbeat":
                busy = msg.metrics.get("busy")
                self.watch.update(msg.sender, now, msg.metrics.get("progress"),
                                  None if busy is None else busy > 0)
            else:
                self.watch.touch(msg.sender, now)
            if msg.kind == "error":
                raise RuntimeError(f"{msg.sender} reported: {msg.text}")
            if msg.kind == "hello":
                self._on_hello(msg.sender)
            if msg.kind == "weights_ready":
                self.adm.version = msg.version
                self.pending_update = msg.version
            if msg.kind == "step_done":
                self._on_step_done(msg)
            if msg.kind == "checkpoint":  # written on a stop signal, between steps
                finish_checkpoint(self, Path(msg.metrics["checkpoint"]), msg.version)
            if msg.kind == "weights_loaded":
                self.rec.on_weights_loaded(msg.sender, msg.version, msg.metrics)
            if msg.kind == "bye" and msg.sender == "trainer-0":
                self.done = True
            msg = self.status.recv(0)
        if self.pending_update is not None and len(self.rollouts_up) == self.cfg.rollout.workers:
            # only once every worker is subscribed: a PUB sent earlier would be lost
            self.control.send(Control("update", self.pending_update))
            self.pending_update = None

    def _on_hello(self, sender: str) -> None:
        self.log.info("%s is up", sender)
        if sender == "trainer-0":
            self.trainer_ready = True
        else:
            self.rollouts_up.add(sender)

    def _on_step_done(self, msg) -> None:
        metrics = dict(msg.metrics)
        ckpt = metrics.pop("checkpoint", "")
        self.rec.on_step_done(msg.version - 1, metrics,
                              {"buffered": len(self.buffer), "running": self.adm.running})
        if ckpt:
            finish_checkpoint(self, Path(ckpt), msg.version)
            self.log.info("checkpoint of version %d complete: %s", msg.version, ckpt)
        self.trainer_ready = True
        self.watch.update(msg.sender, time.monotonic(), busy=False)

    def _check_peers(self, start: float) -> None:
        now, lc = time.monotonic(), self.cfg.launcher
        for peer in self.peers:
            seen = self.last_seen.get(peer)
            if seen is None and now - start > lc.startup_timeout_s:
                raise PeerStalled(f"{peer} did not start within launcher.startup_timeout_s="
                                  f"{lc.startup_timeout_s:.0f}s (see logs/{peer}.log)")
            if seen is not None and now - seen > lc.peer_timeout_s:
                raise PeerStalled(f"{peer} sent no heartbeat for {now - seen:.0f}s; it was "
                                  f"{self.doing.get(peer) or 'busy'} (see logs/{peer}.log for its stack)")
        stalled = self.watch.stalled(now)
        if stalled:
            raise PeerStalled("; ".join(
                f"{peer} made no progress for {idle:.0f}s while it had work (launcher.progress_timeout_s="
                f"{lc.progress_timeout_s:g}); it was {self.doing.get(peer) or 'busy'} (see logs/{peer}.log "
                "for its stack)" for peer, idle in stalled))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    args = ap.parse_args()
    ctl = Controller(args.run_dir)
    try:
        ctl.run()
    except PeerStalled as err:
        ctl.log.error("%s", err)
        ctl.send_stop()
        sys.exit(4)


if __name__ == "__main__":
    run_main(main)

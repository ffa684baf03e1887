"""Controller: dataset cursor, staleness admission, rollout buffer, batches, metrics.

``python -m areal_cli.controller.main <run_dir>``. It binds every ZeroMQ socket of the run,
so it starts first. Its loop: admit groups while the rule allows → collect finished groups
→ when the trainer is ready and B groups are buffered, send the oldest B → handle each status
message by its type (``Controller.on``: ``WeightsReady`` → tell the rollout workers to update,
``StepDone`` → log the step and finish a checkpoint, ...). It also watches heartbeats: a peer silent
for ``launcher.peer_timeout_s``, or holding work without progress for
``launcher.progress_timeout_s`` (controller/peers.py), ends the run with its name and what it was
doing. A non-finite reward is scored 0 and counted.

Beside this loop: ``dataset.py`` (the training split and the cursor over it), ``admission.py``
(the staleness rule's count of groups), ``endpoints.py`` (where the sockets bind),
``peers.py`` and ``liveness.py`` (what each peer last said, and when one is stalled),
``weight_orders.py`` (ordering each weight update until every worker joined it), ``records.py``
(metrics.jsonl, trajectories.jsonl, the trackers) and ``state.py`` (checkpoints and resume).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import numpy as np
import zmq

from areal_cli.config.read import read_yaml
from areal_cli.config.resolve import require_resolved
from areal_cli.controller.admission import Admission
from areal_cli.controller.dataset import Cursor, training_split
from areal_cli.controller.endpoints import planned_endpoints, publish_endpoints
from areal_cli.controller.peers import Peers, PeerStalled
from areal_cli.controller.records import (
    RewardFailed,
    StepRecorder,
    check_batch_rewards,
    zero_nonfinite_rewards,
)
from areal_cli.controller.sleeps import SleepOrders
from areal_cli.controller.state import finish_checkpoint, last_step, restore
from areal_cli.controller.weight_orders import WeightOrders
from areal_cli.rundir import RunDir
from areal_cli.runtime import run_main, setup_process
from areal_cli.staleness import oldest_trainable, too_stale
from areal_cli.tasks import Problem, load_tokenizer, prompt_ids
from areal_cli.tracking.fanout import open_for_run
from areal_cli.transport.auth import Gatekeeper, load_keys
from areal_cli.transport.channels import Channel, Router, max_frame_bytes, shutdown
from areal_cli.transport.messages import (
    Asleep,
    Batch,
    Bye,
    CheckpointWritten,
    GroupResult,
    Heartbeat,
    Hello,
    StaleBefore,
    StepDone,
    Stop,
    WeightsLoaded,
    WeightsReady,
    WorkItem,
    may_send,
)
from areal_cli.workflows.agent.checks import agent_label


class Controller:
    def __init__(self, run_dir: str):
        self.run_dir = Path(run_dir)
        self.rd = RunDir(run_dir)
        self.log = setup_process("controller", run_dir)
        self.cfg = cfg = require_resolved(read_yaml(self.rd.config), str(self.rd.config))
        ep = planned_endpoints(cfg, self.rd)
        keys, limit = load_keys(run_dir), max_frame_bytes(cfg)
        self.gate = Gatekeeper(keys, self.log)  # admits only the run's client key; logs refusals
        wire = dict(bind=True, keys=keys, max_frame=limit, gate=self.gate)
        self.status = Router(ep.status, keys, limit, self.gate)
        self.work = Channel(zmq.PUSH, ep.work, name="work", hwm=4, **wire)
        self.results = Channel(zmq.PULL, ep.results, name="results", **wire)
        self.batches = Channel(zmq.PUSH, ep.batches, name="batches", hwm=2, **wire)
        self.control = Channel(zmq.PUB, ep.control, name="control", **wire)
        self.unexpected = 0  # well-formed frames dropped because nothing sent them legitimately
        publish_endpoints(cfg, self.rd, ep, {c.name: c.addr for c in (
            self.status, self.work, self.results, self.batches, self.control)})
        from areal_cli.model_source import resolve_model

        self.tok = load_tokenizer(resolve_model(cfg.model))
        self.cursor = Cursor(training_split(cfg, self.rd, self.log), cfg.seed)
        total = cfg.rollout.max_concurrent or (cfg.rollout.max_staleness
                                               + 1) * cfg.trainer.batch_size
        self.adm = Admission(cfg.trainer.batch_size, cfg.rollout.max_staleness, total)
        self.buffer: list[GroupResult] = []  # finished, kept, not yet trained
        # group_id → (seq, prompt_id, problem)
        self.groups: dict[int, tuple[int, str, Problem]] = {}
        self.next_group = 0
        self.step = 0  # next step to send
        self.trainer_ready = False
        self.peers = Peers.of_run(cfg)
        self.orders = WeightOrders()
        self.rec = StepRecorder(self.run_dir, cfg)
        self.last_batch = None  # (step, groups, entries) of the batch sent last
        self.done = False
        self.stopping = None  # monotonic time a stop signal arrived
        # what each status message does (who may send it: messages.SENDERS; when: _unexpected)
        # cluster.share=alternate: the workers sleep while the trainer steps (controller/sleeps.py)
        self.sleeps = SleepOrders() if cfg.cluster.share == "alternate" else None
        self.on = {Hello: self._on_hello, Heartbeat: self._on_heartbeat,
                   WeightsReady: self._on_weights_ready,
                   StepDone: self._on_step_done, CheckpointWritten: self._on_checkpoint_written,
                   Bye: self._on_bye, WeightsLoaded: self._on_weights_loaded,
                   Asleep: self._on_asleep}
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        logged = last_step(self.run_dir)  # before a resume cuts metrics.jsonl to its checkpoint
        if cfg.resume:
            restore(self, Path(cfg.resume))
        self.rec.tracking = open_for_run(self.run_dir, cfg, self.log,
                                         self.step if cfg.resume else None,
                                         logged if cfg.resume else -1)

    def _on_signal(self, signum, _frame) -> None:
        # keep serving until the trainer has checkpointed and said bye (bounded in run())
        self.stopping = self.stopping or time.monotonic()

    # ---- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        self.log.info("waiting for %s", ", ".join(sorted(self.peers.names)))
        start = time.monotonic()
        while not self.done:
            if self.stopping and time.monotonic() - self.stopping > 60:
                self.log.warning("stop signal: the trainer did not finish within 60s")
                break
            self._admit()
            self._collect()
            self._maybe_send_batch()
            self._handle_status()
            self.peers.check(time.monotonic(), start, self.cfg.launcher, self.adm.version)
        self.control.send(Stop())
        self.log.info("run finished: %d steps", self.step)

    def close(self) -> None:
        """Close every socket; the last "stop" to the rollout workers still goes out (1 s at
        most)."""
        for ch in (self.status, self.work, self.results, self.batches):
            ch.close()
        self.control.close(linger_s=1.0)
        self.gate.stop()
        if self.rec.tracking:
            self.rec.tracking.close()
            self.log.info("experiment trackers: %.2fs in all", self.rec.tracking.spent_s)
        shutdown()
        self.log.info("sockets closed (%d frames dropped, %d unexpected messages, %d connections "
                      "refused)",
                      sum(c.dropped for c in (self.status, self.results)), self.unexpected,
                      self.gate.refused)

    def _admit(self) -> None:
        r = self.cfg.rollout
        while self.adm.can_admit():
            seq, pid, problem = self.cursor.next()
            prompt = np.asarray(prompt_ids(self.tok, problem, self.cfg.task), np.int32)
            item = WorkItem(self.next_group, pid, prompt, r.group_size, r.max_new_tokens,
                            problem.to_dict(),
                            self.adm.version)
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
        if g.group_id not in self.groups or any(b.group_id == g.group_id for b in self.buffer):
            self.log.warning("dropping a result for unknown group %d (from before a restart)",
                             g.group_id)
            return
        self.rec.on_counters(g.counters)
        if g.failed and not g.samples:
            return self._failed_group(g)
        if g.failed:  # workflow.agent_failed_episode=reward_zero: trained, failures still counted
            self._check_failures()
        if g.stale:
            return self._stopped_stale(g)
        expected = self.cfg.rollout.group_size
        if g.episodes() != expected:
            return self._drop(f"a result of group {g.group_id} with {g.episodes()} episodes, not "
                              f"{expected}")
        bad = zero_nonfinite_rewards(g)
        if bad:
            self.log.warning("group %d (%s) from rollout-%d: %d non-finite reward(s) scored 0",
                             g.group_id,
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

    def _failed_group(self, g: GroupResult) -> None:
        """A group with failed agent episodes: not trained, its slot freed; too many failures stop
        the run."""
        self.adm.finish(kept=False)
        del self.groups[g.group_id]
        self.log.warning("group %d (%s) from rollout-%d: %d episode(s) failed, not trained (see "
                         "logs/rollout-%d.log)",
                         g.group_id, g.prompt_id, g.worker, g.failed, g.worker)
        self._check_failures()

    def _check_failures(self) -> None:
        """Stop the run when more than workflow.max_failed_fraction of the episodes finished since
        the last step failed (counted once a step's worth has finished)."""
        c, w = self.rec.window, self.cfg.workflow
        if c["agent_episodes"] >= self.cfg.trainer.batch_size * self.cfg.rollout.group_size and \
                c["agent_failed"] > w.max_failed_fraction * c["agent_episodes"]:
            raise PeerStalled(f"{agent_label(w)}: {c['agent_failed']:.0f} of "
                              f"{c['agent_episodes']:.0f} episodes failed since the last step "
                              "(more than "
                              f"workflow.max_failed_fraction={w.max_failed_fraction:g}); the "
                              "tracebacks are in logs/rollout-*.log")

    def _stopped_stale(self, g: GroupResult) -> None:
        """A group its worker stopped as too stale for any batch to come (``Workflow.drop_stale``):
        its slot is freed and its prompt drawn again, as one dropped here (``_drop_stale``)."""
        self.adm.finish(kept=False)
        self.rec.on_stale_stopped(g)
        self.cursor.requeue(*self.groups.pop(g.group_id))

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
        if self.sleeps is not None and not self.sleeps.ready(self.step, self.control,
                                                             self.cfg.rollout.workers):
            return  # the batch goes once every worker sleeps
        batch, self.buffer = self.buffer[:B], self.buffer[B:]
        # before the trainer sees it
        check_batch_rewards(self.step, batch, self.cfg.reward.max_error_fraction)
        self.last_batch = (self.step, batch, [self.groups[g.group_id] for g in batch])
        self.batches.send(Batch(self.step, batch))
        self.peers.watch.update("trainer-0", time.monotonic(), busy=True)
        self.rec.on_batch(self.step, batch,
                          {g.group_id: self.groups[g.group_id][2].prompt for g in batch})
        for g in batch:
            del self.groups[g.group_id]
        self.log.info("batch %d sent (%d groups buffered, %d running)", self.step, len(self.buffer),
                      self.adm.running)
        self.trainer_ready = False
        self.step += 1
        oldest = oldest_trainable(self.step, self.cfg.rollout.max_staleness)
        if oldest > 0:  # the workers stop what no batch to come can train
            self.control.send(StaleBefore(oldest))

    def _oldest_finished(self, B: int) -> bool:
        """admission order: the B oldest outstanding prompts must all be finished."""
        outstanding = sorted([s for s, _, _ in self.groups.values()]
                             + [s for s, _, _ in self.cursor.requeued])
        return [self._seq(g) for g in self.buffer[:B]] == outstanding[:B]

    def _drop_stale(self) -> None:
        oldest, kept = oldest_trainable(self.step, self.cfg.rollout.max_staleness), []
        for g in self.buffer:
            starts = [int(s.versions[s.loss_mask.astype(bool)][0]) for s in g.samples
                      if s.loss_mask.any()]
            if starts and too_stale(min(starts), oldest):
                self.adm.drop_accepted()
                self.rec.stale_dropped += 1
                self.rec.stale_dropped_tokens += sum(int(s.loss_mask.sum()) for s in g.samples)
                self.cursor.requeue(*self.groups.pop(g.group_id))
            else:
                kept.append(g)
        self.buffer = kept

    def _handle_status(self) -> None:
        msg = self.status.recv(0)
        while msg is not None:
            why = self._unexpected(msg)
            if why:
                self._drop(f"{type(msg).__name__} from {msg.sender!r}: {why}")
            else:
                self.peers.heard(msg, time.monotonic())
                self.on[type(msg)](msg)
            msg = self.status.recv(0)
        self.orders.send(self.control, self.peers, self.cfg.rollout.workers, self.log)

    def _unexpected(self, msg) -> str:
        """Why ``msg`` cannot be a legitimate status message now ("" if it can). Versions are
        checked against the controller's own count of steps: it sent batch ``step - 1`` last."""
        if msg.sender not in self.peers.names:
            return "not a process of this run"
        if not may_send(type(msg), msg.sender):
            return f"{msg.sender} never sends {type(msg).__name__}"
        if isinstance(msg, StepDone):
            if msg.version != self.step:
                return f"version {msg.version}, but batch {self.step - 1} was the last one sent"
            if (self.trainer_ready or self.last_batch is None
                    or self.last_batch[0] != msg.version - 1):
                return "no batch of that step is being trained"
        if isinstance(msg, (WeightsReady, CheckpointWritten)) and msg.version not in (self.step - 1,
                                                                                      self.step):
            # WeightsReady: after step v - 1 (batch v not sent yet), or on resume (batch v may be)
            return f"version {msg.version}, but batch {self.step - 1} was the last one sent"
        return ""

    # ---- one handler per status message type (self.on) -----------------------------------

    def _on_hello(self, msg: Hello) -> None:
        self.log.info("%s is up", msg.sender)
        if msg.sender == "trainer-0":
            self.trainer_ready = True
        else:
            self.peers.rollouts_up.add(msg.sender)

    def _on_heartbeat(self, msg: Heartbeat) -> None:
        self.peers.on_heartbeat(msg, time.monotonic())

    def _on_weights_ready(self, msg: WeightsReady) -> None:
        self.adm.version = max(self.adm.version, msg.version)
        self.orders.pending = msg.version

    def _on_step_done(self, msg: StepDone) -> None:
        self.rec.on_step_done(msg.version - 1, dict(msg.metrics),
                              {"buffered": len(self.buffer), "running": self.adm.running})
        self.rec.warn_stale_waste(msg.version, self.log)
        if msg.checkpoint:
            self._finish_checkpoint(msg.version)
        self.trainer_ready = True
        self.peers.watch.update(msg.sender, time.monotonic(), busy=False)

    # on a stop signal, between steps
    def _on_checkpoint_written(self, msg: CheckpointWritten) -> None:
        self._finish_checkpoint(msg.version)

    def _on_weights_loaded(self, msg: WeightsLoaded) -> None:
        # culprits(): who a trainer stuck sending weights waits for
        self.peers.loaded[msg.sender] = msg.version
        self.rec.on_weights_loaded(msg.sender, msg.version, msg.timings)

    def _on_asleep(self, msg: Asleep) -> None:
        if self.sleeps is not None:
            self.sleeps.on_asleep(msg)

    def _on_bye(self, msg: Bye) -> None:
        self.log.info("the trainer %s", "finished" if msg.finished else "stopped")
        self.done = True

    def _drop(self, what: str) -> None:
        self.unexpected += 1
        self.log.warning("dropped an unexpected message (%d so far): %s", self.unexpected, what)

    def _finish_checkpoint(self, version: int) -> None:
        """Complete the checkpoint the trainer wrote for ``version``: its directory is derived
        here from the version, never taken from a message."""
        partial = self.rd.partial_checkpoint(version)
        if not (partial / "trainer.json").is_file():
            return self._drop(f"checkpoint of version {version} announced, but {partial} is "
                              "incomplete")
        finish_checkpoint(self, partial, version)
        self.log.info("checkpoint of version %d complete", version)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    args = ap.parse_args()
    ctl = Controller(args.run_dir)
    try:
        ctl.run()
    except (PeerStalled, RewardFailed) as err:
        ctl.log.error("%s", err)
        ctl.control.send(Stop())
        ctl.close()
        sys.exit(4)
    ctl.close()


if __name__ == "__main__":
    run_main(main)

"""Rollout worker: pulls prompt groups, generates with its engine, scores, pushes trajectories.

``python -m areal_cli.rollout.main <run_dir> <index>``. Weight updates arrive as
``UpdateWeights(v)`` on the control channel: the worker asks its engine to update, and the
engine pauses, receives trainer rank 0's broadcast through its own receiver, loads in place and
resumes every unfinished sequence under v.
"""

from __future__ import annotations

import argparse
import collections
import gc
import signal
import time

import zmq

from areal_cli import faults
from areal_cli.config.read import read_yaml
from areal_cli.config.resolve import require_resolved
from areal_cli.config.schema import RootConfig, worker_concurrency
from areal_cli.engines.base import EngineSetup, Sampling, WeightSource
from areal_cli.engines.factory import make_engine
from areal_cli.model_source import resolve_model
from areal_cli.rewards.client import ServedRewards, reward_address
from areal_cli.rewards.combined import make_rewards
from areal_cli.rundir import RunDir
from areal_cli.runtime import StatusLink, run_main, set_threads, setup_process
from areal_cli.staleness import oldest_trainable
from areal_cli.tasks import load_tokenizer
from areal_cli.transport.auth import load_keys
from areal_cli.transport.channels import Channel, Endpoints, max_frame_bytes
from areal_cli.transport.messages import (
    Asleep,
    Hello,
    Phase,
    Sleep,
    StaleBefore,
    Stop,
    UpdateWeights,
    WeightsLoaded,
)
from areal_cli.workflows import workflow_class
from areal_cli.workflows.base import Workflow


def engine_setup(cfg: RootConfig, index: int, tokenizer, ep: Endpoints) -> EngineSetup:
    """Rollout worker ``index``'s engine: sampling at rollout.temperature / top_p, a KV cache for
    its concurrent groups, joined to trainer rank 0's weight group."""
    # areal train resolves engine.kv_cache_tokens from the longest prompt; this context is for a
    # worker started some other way
    context = max(256,
                  len(tokenizer.apply_chat_template([{"role": "user", "content": "x"}],
                                                    tokenize=False))
                  ) + cfg.rollout.max_new_tokens * max(1, cfg.workflow.max_turns) + 128
    return EngineSetup(cfg.engine, resolve_model(cfg.model), tokenizer.eos_token_id,
                       Sampling(cfg.rollout.temperature, cfg.rollout.top_p),
                       sequences=concurrency(cfg) * cfg.rollout.group_size, context=context,
                       seed=cfg.seed,
                       index=index,
                       weights=WeightSource(cfg, ep.weights_host, ep.weights_port,
                                            ep.weights_store),
                       routing=cfg.algorithm.routing_replay)


def make_workflow(cfg: RootConfig, engine, pool, tok, index: int, run_dir: str | None) -> Workflow:
    """The worker's workflow: the class ``workflow.name`` names (``areal_cli.workflows``)."""
    return workflow_class(cfg.workflow.name).from_run(cfg, engine, pool, tok, index, run_dir)


def concurrency(cfg: RootConfig) -> int:
    """Prompt groups one worker generates at once."""
    return worker_concurrency(cfg)


class GenerationSpeed:
    """Tokens of finished sequences over the time the engine held sequences, and how many it held
    on average then, logged every ``every_s``: the engine's speed inside the run, where the step
    lines' "gen tok/s" is also bounded by how much work the trainer lets the worker start."""

    def __init__(self, every_s: float = 30.0):
        self.every_s, self.tokens, self.busy_s, self.held_s = every_s, 0, 0.0, 0.0
        self.wall0 = self.last = time.perf_counter()
        self.run = [0, 0.0, 0.0]  # the same over the whole run: tokens, busy_s, held_s
        self.gc_s, self._gc_t0 = 0.0, 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_t0

    def add(self, held: int, log) -> None:
        """One turn of the worker's loop; ``held``: sequences in the engine when it began."""
        now = time.perf_counter()
        self.busy_s += now - self.last if held else 0.0
        self.held_s += (now - self.last) * held
        self.last = now
        if now - self.wall0 >= self.every_s:
            self._log(log, "generation: %d tokens in %.0fs", self.tokens, now - self.wall0,
                      self.busy_s, self.held_s)
            self.run = [self.run[0] + self.tokens, self.run[1] + self.busy_s,
                        self.run[2] + self.held_s]
            self.tokens, self.busy_s, self.held_s, self.wall0 = 0, 0.0, 0.0, now

    def close(self, log) -> None:
        """The line of the whole run (benchmarks/agent_throughput.py reads its sequences)."""
        tokens, busy, held = (self.run[0] + self.tokens, self.run[1] + self.busy_s,
                              self.run[2] + self.held_s)
        self._log(log, "generation over the run: %d tokens, %.0fs", tokens, busy, busy, held)
        log.info("garbage collection: %.1fs of the worker's time over the run", self.gc_s)

    @staticmethod
    def _log(log, head: str, tokens: int, wall_s: float, busy_s: float, held_s: float) -> None:
        busy = max(busy_s, 1e-9)
        log.info(head + ", %.0fs of it generating: %.0f tokens/s generating, %.1f sequences at "
                 "once", tokens, wall_s, busy_s, tokens / busy, held_s / busy)


class Worker:
    def __init__(self, run_dir: str, index: int):
        self.name = f"rollout-{index}"
        self.log = setup_process(self.name, run_dir)
        self.cfg = require_resolved(read_yaml(RunDir(run_dir).config), str(RunDir(run_dir).config))
        self.index = index
        self.run_dir = run_dir
        ep = Endpoints.load(run_dir)
        keys, limit = load_keys(run_dir), max_frame_bytes(self.cfg)
        self.hb = StatusLink(ep, keys, self.name, self.cfg.launcher.heartbeat_s, limit)
        set_threads(self.cfg.engine.threads)
        import torch

        torch.manual_seed(self.cfg.seed * 1000 + index)
        self.hb.doing = "loading the model"
        self.tok = load_tokenizer(resolve_model(self.cfg.model))
        self.engine = make_engine(engine_setup(self.cfg, index, self.tok, ep), self._doing)
        self.hb.doing = ("starting its reward pool (and waiting for the reward-model process, if "
                         "any)")
        self.pool = make_rewards(self.cfg.reward, self.cfg.reward.workers, lambda: ServedRewards(
            self.cfg.reward, reward_address(run_dir, self.cfg.launcher.startup_timeout_s),
            self.name, keys, limit))
        self.flow = make_workflow(self.cfg, self.engine, self.pool, self.tok, index, run_dir)
        wire = dict(bind=False, keys=keys, max_frame=limit)
        self.work = Channel(zmq.PULL, ep.work, name="work", hwm=2, **wire)
        self.results = Channel(zmq.PUSH, ep.results, name="results", **wire)
        self.control = Channel(zmq.SUB, ep.control, name="control", **wire)
        self.held: collections.deque = collections.deque()  # work waiting for a newer version
        self.updating: int | None = None  # the weight version on its way (begun, not yet applied)
        self.next_update: int | None = None  # a newer version ordered meanwhile
        self.update_t0 = 0.0
        # cluster.share=alternate: the batch the controller asked this worker to sleep for, and the
        # one it sleeps for (until the next update)
        self.sleep_asked: int | None = None
        self.asleep_for: int | None = None
        self.last_slept = -1
        self.asleep_t0, self.asleep_s = 0.0, None
        self.capacity = concurrency(self.cfg)
        self.hb.busy = lambda: self.flow.busy() + len(self.held)  # work held: progress is due
        self.speed = GenerationSpeed()
        self.hb.send(Hello(self.name))
        self.log.info("ready: engine=%s, %d groups at once", self.cfg.engine.name, self.capacity)
        gc.collect()
        gc.freeze()  # what start-up made lives as long as the worker: no collection scans it again
        gc.set_threshold(50_000, 20, 100)

    def _doing(self, what: str) -> None:
        self.hb.doing = what

    def _on_signal(self, signum, _frame) -> None:
        # keep serving weight updates so the trainer can finish its step and checkpoint;
        # the controller says "stop" when it is done (bounded below)
        self.stopping = self.stopping or time.monotonic()

    def run(self) -> None:
        self.stopping = None
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        while True:
            if self.stopping and time.monotonic() - self.stopping > 60:
                self.log.warning("stop signal: no stop from the controller within 60s")
                break
            msg = self.control.recv(0)
            if isinstance(msg, Stop):
                self._finish_update_before_stop()
                break
            if isinstance(msg, UpdateWeights):
                if self.asleep_for is not None and msg.version > self.engine.version:
                    self._wake()
                self._order(msg.version)
            if isinstance(msg, StaleBefore):
                self._drop_stale(msg.version)
            if isinstance(msg, Sleep):
                self._asked_to_sleep(msg.step)
            self._continue_update()
            if self.sleep_asked is not None and self.updating is None:
                self._sleep()  # after the update on its way: the trainer's next step needs it
            if self.asleep_for is not None:
                self.hb.advance()  # waiting by design, not stuck
                time.sleep(0.02)
            else:
                self._step_engine()
            for result in self.flow.poll():
                self.results.send(result)
                self.hb.advance()
        self.log.info("stop received")
        self.speed.close(self.log)

    def _step_engine(self) -> None:
        """Take work while there is room, step the engine once and hand what finished to the
        workflow."""
        if self.updating is None:
            # said after an update too: a worker frozen in _take_work must not still claim to be
            # receiving
            self.hb.doing = (f"generating ({self.flow.busy()} groups, version "
                             f"{self.engine.version})")
        if not self.stopping:
            self._take_work()
        in_engine = self.engine.in_flight()
        # while an update arrives the loop comes back soon to see it ready
        for seq in self.engine.poll(0.01 if self.updating is not None else 0.02
                                    if self.flow.busy() else 0.1):
            self.flow.on_generated(seq)
            self.hb.advance()
            self.speed.tokens += len(seq.output_ids)
        self.speed.add(in_engine, self.log)

    def _take_work(self) -> None:
        while self.flow.busy() + len(self.held) < self.capacity:
            item = self.work.recv(0)
            if item is None:
                break
            self.held.append(item)
        while self.held and self.held[0].min_version <= self.engine.version:
            faults.point("generate", self.engine.version, self.run_dir)
            self.flow.start(self.held.popleft())

    def _finish_update_before_stop(self, limit_s: float = 60.0) -> None:
        """An update on its way is taken in before the worker stops (the trainer's broadcast
        completes), for
        ``limit_s`` at most: a trainer that died mid-broadcast must not hold the stop."""
        deadline = time.monotonic() + limit_s
        while self.updating is not None and time.monotonic() < deadline:
            self.engine.poll(0.01)
            self._continue_update()
        if self.updating is not None:
            self.log.warning("stopping with the update to version %d not received within %.0fs",
                             self.updating,
                             limit_s)

    def _order(self, version: int) -> None:
        """An order to take in weights of ``version``: begun now, or after the update on its way."""
        have = self.engine.version if self.updating is None else self.updating
        if version < self.engine.version:
            self.log.warning("ignored an update to version %d: the weights are at %d", version,
                             self.engine.version)
        elif version <= have:
            pass  # the controller repeats an order until it hears that the worker has joined
        elif self.updating is not None:
            self.next_update = max(self.next_update or 0, version)
        else:
            self._begin_update(version)

    def _begin_update(self, version: int) -> None:
        """Start taking in ``version``: behind generation where the engine can (the loop goes on
        starting groups and sending results until ``_continue_update`` finds it ready), else all at
        once there."""
        self.hb.set_doing(f"receiving weights of version {version} from trainer rank 0",
                          Phase.receiving_weights,
                          version)
        faults.point("weights", version, self.run_dir)
        self.updating, self.update_t0 = version, time.perf_counter()
        self.engine.begin_update(version)

    def _continue_update(self) -> None:
        if self.updating is None or not self.engine.update_ready():
            return
        version, self.updating = self.updating, None
        timings = self.engine.finish_update()
        timings["update_total_s"] = time.perf_counter() - self.update_t0
        if self.asleep_s is not None:  # the sleep this update ends (cluster.share=alternate)
            timings["asleep_s"], self.asleep_s = self.asleep_s, None
        # an engine that generates meanwhile says
        timings.setdefault("pause_total_s", timings["update_total_s"])
        if self.cfg.weights.verify:
            timings["weights_sha"] = self.engine.weights_digest()
        self.hb.send(WeightsLoaded(self.name, version, timings))
        # every batch from now on is of this version or later (the controller's word may come later
        # still)
        self._drop_stale(oldest_trainable(version, self.cfg.rollout.max_staleness))
        self.log.info("weights v%d loaded in %.3fs, generation held %.3fs "
                      "(%d sequences continue)%s", version,
                      timings["update_total_s"], timings["pause_total_s"],
                      timings.get("interrupted", 0),
                      "; the adapter did not change (delta exactly zero)"
                      if timings.get("adapter_delta_zero") else
                      "; the weights did not change" if timings.get("weights_unchanged") else "")
        if self.next_update is not None:
            later, self.next_update = self.next_update, None
            self._begin_update(later)

    def _asked_to_sleep(self, step: int) -> None:
        """``Sleep`` for batch ``step`` (cluster.share=alternate); repeated by the controller until
        it hears ``Asleep``, which is said again for a repeat."""
        if self.asleep_for is not None and step >= self.asleep_for:
            self.asleep_for = step  # still asleep (a later batch: the order to wake was repeated)
            self.hb.send(Asleep(self.name, step, {}))
        elif self.asleep_for is None and step > self.last_slept:  # not a late repeat of an old one
            self.sleep_asked = step

    def _sleep(self) -> None:
        step, self.sleep_asked = self.sleep_asked, None
        timings = self.engine.sleep()
        self.asleep_for = self.last_slept = step
        self.asleep_t0 = time.perf_counter()
        self.hb.send(Asleep(self.name, step, timings))
        self.hb.doing = (f"asleep while the trainer steps batch {step} (cluster.share=alternate; "
                         f"{self.flow.busy()} groups wait)")
        self.log.info("asleep for batch %d: %d groups wait%s", step, self.flow.busy(),
                      f"; {timings['freed_bytes'] / 2**30:.1f} GiB freed in "
                      f"{timings['sleep_s']:.2f}s" if "freed_bytes" in timings else "")

    def _wake(self) -> None:
        timings = self.engine.wake()
        self.asleep_s = time.perf_counter() - self.asleep_t0
        self.log.info("awake after batch %d: asleep %.2fs, woke in %.2fs", self.asleep_for,
                      self.asleep_s, timings.get("wake_s", 0.0))
        self.asleep_for = None

    def _drop_stale(self, oldest: int) -> None:
        """The groups whose first model token is older than version ``oldest`` stop generating: no
        batch to come can take them (``Workflow.drop_stale``; workflow=agent's episodes run to their
        end and the controller drops them)."""
        if oldest <= 0:
            return
        stale = self.flow.drop_stale(oldest)
        for result in stale:
            self.results.send(result)
        if stale:
            self.log.info("stopped %d group(s) begun before v%d: no batch to come can train them "
                          "(rollout.max_staleness=%d; %d tokens)", len(stale), oldest,
                          self.cfg.rollout.max_staleness, sum(r.gen_tokens for r in stale))

    def close(self) -> None:
        self.flow.close()
        self.engine.close()
        self.pool.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("index", type=int)
    args = ap.parse_args()
    worker = Worker(args.run_dir, args.index)
    try:
        worker.run()
    finally:
        worker.close()


if __name__ == "__main__":
    run_main(main)

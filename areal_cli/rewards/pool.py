"""RewardPool: scoring in worker processes, each call bounded by reward.timeout_s.

Guarantees: submit() never blocks; a call that overstays its timeout (counted from when a
worker picks it up) or raises scores 0 with status "timeout" / "error", is counted in
`timeouts` / `errors` and logged once with its problem id; a score that is NaN or infinite
scores 0 with status "nonfinite" (counted in `nonfinite`): one NaN reward would make the
model NaN in one step. A hung or dead worker process is killed and replaced, so one bad sample
never holds up the others. The pool's thread cannot die: an exception in it is logged with its
traceback and the loop goes on; a Future the caller cancelled is simply not resolved.
"""

from __future__ import annotations

import collections
import logging
import math
import multiprocessing as mp
import os
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from areal_cli.config.task import RewardConfig
from areal_cli.tasks.base import Problem

logger = logging.getLogger(__name__)
MAX_START_FAILURES = 5
MAX_LOOP_FAILURES = 100  # consecutive exceptions in the pool's thread before it fails every call


@dataclass
class RewardResult:
    score: float
    """The reward; 0.0 unless status is "ok"."""
    status: str
    """"ok" | "timeout" | "error" | "nonfinite"."""
    detail: str = ""
    """Why, when status is not "ok"."""
    sandbox: str = ""
    """Which isolation ran the completion's code ("bwrap" | "unsafe_none"); "" = no code ran."""
    parts: dict = field(default_factory=dict)
    """A combined or served reward: each part's score and status, and its reward-model batch
    (``transport.messages.Sample.reward_parts``); {} for a single verifier."""


@dataclass
class _Job:
    future: Future
    completion: str
    problem: Problem


class _Worker:
    """One scoring process, its pipe, and the job it is running (if any)."""

    def __init__(self, ctx, cfg: RewardConfig):
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child_conn, cfg), daemon=True)
        self.process.start()
        child_conn.close()
        self.ready = False
        self.job: _Job | None = None
        self.deadline = float("inf")

    def start(self, job: _Job, timeout_s: float) -> None:
        self.job, self.deadline = job, time.monotonic() + timeout_s
        self.conn.send((job.completion, job.problem))

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


def _worker_main(conn, cfg: RewardConfig) -> None:
    from areal_cli.rewards.code_reward import last_isolation
    from areal_cli.rewards.scoring import score

    _prewarm(cfg)
    conn.send(("ready", 0.0, "", ""))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        completion, problem = message
        last_isolation["isolation"] = ""
        try:
            conn.send(("ok", score(completion, problem, cfg), "", last_isolation["isolation"]))
        except Exception as e:  # noqa: BLE001 - any scorer failure is reported as "error"
            conn.send(("error", 0.0, f"{type(e).__name__}: {e}", last_isolation["isolation"]))


def _prewarm(cfg: RewardConfig) -> None:
    """Import what the scorer needs before declaring ready, so it does not eat a timeout."""
    if cfg.fn in ("auto", "reasoning_gym"):
        import reasoning_gym  # noqa: F401
    if cfg.fn in ("auto", "math_verify"):
        import math_verify  # noqa: F401
    if ":" in cfg.fn:
        from areal_cli.rewards.scoring import import_custom

        import_custom(cfg.fn)


class RewardPool:
    """A pool of reward worker processes with a per-call timeout (see the module docstring)."""

    def __init__(self, cfg: RewardConfig, num_workers: int = 2):
        if not isinstance(cfg.fn, str) or cfg.served:
            raise ValueError(f"reward.fn={cfg.fn}: a reward pool scores one verifier; model and "
                             "judge parts are scored by the reward-model process of `areal train` "
                             "(rewards/combined.py)")
        if num_workers < 1:
            raise ValueError(f"RewardPool num_workers={num_workers}: use at least 1")
        if ":" in cfg.fn:
            from areal_cli.rewards.scoring import import_custom

            import_custom(cfg.fn)  # a bad import path fails here, not in every worker
        if cfg.sandbox == "unsafe_none":
            from areal_cli.rewards.sandbox import announce

            announce(cfg.sandbox)
        self.cfg = cfg
        self.timeouts = 0
        self.errors = 0
        self.sandbox_runs: collections.Counter[str] = collections.Counter()
        """Results whose code ran in each isolation ("bwrap", "unsafe_none")."""
        self.nonfinite = 0
        self._loop_failures = 0
        self._ctx = mp.get_context("spawn")
        self._pending: collections.deque[_Job] = collections.deque()
        self._lock = threading.Lock()
        self._closed = False
        self._start_failures = 0
        self._broken = ""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._workers = [_Worker(self._ctx, cfg) for _ in range(num_workers)]
        self._thread = threading.Thread(target=self._run, name="reward-pool", daemon=True)
        self._thread.start()

    def submit(self, completion: str, problem: Problem) -> Future:
        """Queue one completion; the Future resolves to a RewardResult (never raises)."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardPool.submit after close()")
            if self._broken:
                settle(future, RewardResult(0.0, "error", self._broken))
                return future
            self._pending.append(_Job(future, completion, problem))
        os.write(self._wake_w, b"x")
        return future

    def close(self) -> None:
        """Stop the workers; calls still queued resolve with status "error"."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        for w in self._workers:
            if w.job is not None:
                settle(w.job.future, RewardResult(0.0, "error", "reward pool closed"))
            w.kill()
        for job in self._pending:
            settle(job.future, RewardResult(0.0, "error", "reward pool closed"))
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self) -> None:
        while not self._closed:
            try:
                self._turn()
                self._loop_failures = 0
            except Exception:  # noqa: BLE001 — this thread must not die: every pending call would hang
                self._loop_failures += 1
                logger.exception("reward pool: error in its thread (%d in a row); continuing",
                                 self._loop_failures)
                if self._loop_failures >= MAX_LOOP_FAILURES:
                    self._fail_pending(f"the reward pool's thread failed {MAX_LOOP_FAILURES} times "
                                       "in a row")
                time.sleep(0.05)

    def _turn(self) -> None:
        """One turn of the pool's thread: hand out calls, wait for a result, a death or a
        deadline."""
        if not self._workers and not self._broken:  # a replacement failed to start last turn
            self._workers.append(_Worker(self._ctx, self.cfg))
        self._assign()
        busy = [w for w in self._workers if w.job is not None]
        timeout = min((w.deadline for w in busy), default=None)
        if timeout is not None:
            timeout = max(0.0, timeout - time.monotonic())
        handles = [self._wake_r] + [w.conn for w in self._workers]
        ready = wait(handles + [w.process.sentinel for w in self._workers], timeout)
        if self._wake_r in ready:
            self._drain_wake()
        for w in list(self._workers):
            if w.conn in ready or w.process.sentinel in ready:
                self._receive(w)
        self._expire()

    def _assign(self) -> None:
        with self._lock:
            for w in self._workers:
                if w.ready and w.job is None and self._pending:
                    w.start(self._pending.popleft(), self.cfg.timeout_s)

    def _receive(self, w: _Worker) -> None:
        try:
            status, score, detail, sandbox = w.conn.recv()
        except (EOFError, OSError):
            w.process.join(timeout=1.0)  # it closed its pipe by exiting: collect the code
            code = w.process.exitcode
            self._replace(w, f"reward worker died (exit code {code})", "error")
            return
        if status == "ready":
            w.ready, self._start_failures = True, 0
            return
        if sandbox:
            self.sandbox_runs[sandbox] += 1
        result = _checked(status, score, detail)
        result.sandbox = sandbox
        self._finish(w, result)

    def _expire(self) -> None:
        now = time.monotonic()
        for w in list(self._workers):
            if w.job is not None and now >= w.deadline:
                self._replace(w, f"no result within {self.cfg.timeout_s}s", "timeout")

    def _finish(self, w: _Worker, result: RewardResult) -> None:
        job, w.job, w.deadline = w.job, None, float("inf")
        if job is None:
            return
        if result.status != "ok":
            self._count(result.status, job.problem.id, result.detail)
        settle(job.future, result)

    def _replace(self, w: _Worker, detail: str, status: str) -> None:
        """Kill a hung or dead worker, fail its job with `status`, start a fresh one."""
        if w.job is None and not w.ready:
            self._start_failures += 1
        w.kill()
        self._finish(w, RewardResult(0.0, status, detail))
        self._workers.remove(w)
        if self._start_failures > MAX_START_FAILURES:
            self._fail_pending(f"reward workers keep dying at start: {detail}")
            return
        self._workers.append(_Worker(self._ctx, self.cfg))

    def _fail_pending(self, detail: str) -> None:
        logger.error("reward pool: %s; failing all queued calls", detail)
        with self._lock:
            self._broken = detail
            jobs, self._pending = list(self._pending), collections.deque()
        for w in self._workers:  # calls running in a worker fail too: nothing waits forever
            if w.job is not None:
                job, w.job, w.deadline = w.job, None, float("inf")
                jobs.append(job)
        for job in jobs:
            self._count("error", job.problem.id, detail)
            settle(job.future, RewardResult(0.0, "error", detail))

    def _count(self, status: str, problem_id: str, detail: str) -> None:
        if status == "timeout":
            self.timeouts += 1
        elif status == "nonfinite":
            self.nonfinite += 1
        else:
            self.errors += 1
        logger.warning("reward %s for problem %s: %s", status, problem_id, detail)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                continue
        except BlockingIOError:  # drained
            return


def _checked(status: str, score, detail: str) -> RewardResult:
    """A worker's answer as a RewardResult; a score that is not a finite number scores 0."""
    if status != "ok":
        return RewardResult(0.0, status, detail)
    try:
        value = float(score)
    except (TypeError, ValueError):
        return RewardResult(0.0, "error", f"the reward function returned {score!r}, not a number")
    if not math.isfinite(value):
        return RewardResult(0.0, "nonfinite", f"the reward function returned {value}")
    return RewardResult(value, "ok")


def settle(future: Future, result: RewardResult) -> None:
    """Set a call's result unless its caller already cancelled it."""
    try:
        future.set_result(result)
    except InvalidStateError:
        pass

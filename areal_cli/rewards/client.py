"""A rollout worker's side of the reward-model process: ``ServedRewards.submit`` queues one
(part, problem, completion) and returns a Future of a ``RewardResult``.

Guarantees, as the reward pool's: submit() never blocks; every call resolves within
reward.timeout_s of the moment the reward-model process takes it (``RewardTaken``), and within
``QUEUED`` times that of its submission while it is not taken (queued behind others' calls): a
reply, or status "timeout" (counted in ``timeouts``) when none came in time (the process is busy,
hung or dead; a late reply is dropped); status "error"
(counted in ``errors``) for a failed batch; a judge's unparseable verdict comes back as
"parse_error" (``parse_errors``) or "error", per reward.judge.on_parse_error. One thread owns
the DEALER socket (ZeroMQ sockets are single-threaded); callers only touch a queue.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import math
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import zmq

from areal_cli.config.task import RewardConfig
from areal_cli.rewards.pool import RewardResult, settle
from areal_cli.rundir import RunDir
from areal_cli.tasks.base import Problem
from areal_cli.transport.auth import Keys
from areal_cli.transport.channels import reward_client
from areal_cli.transport.messages import RewardReply, RewardRequest, RewardTaken

logger = logging.getLogger(__name__)
PROCESS = "reward-model"
QUEUED = 10
"""A call not yet taken by the reward-model process (queued behind other calls: a judge on 2 CPU
cores scores a step's completions in several forwards) times out after this many
reward.timeout_s."""


def reward_address(run_dir: str | Path, timeout_s: float) -> str:
    """The reward-model process's address, once it has published it (it does after loading its
    models)."""
    path, deadline = RunDir(run_dir).reward_endpoint, time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {PROCESS} process published no address within "
                               f"launcher.startup_timeout_s={timeout_s:g}s (see "
                               f"logs/{PROCESS}.log)")
        time.sleep(0.1)
    return json.loads(path.read_text())["reward"]


class ServedRewards:
    def __init__(self, cfg: RewardConfig, addr: str, name: str, keys: Keys, max_frame: int):
        self.cfg, self.addr, self.name = cfg, addr, name
        self.timeouts = self.errors = self.parse_errors = 0
        self._ids = itertools.count()
        self._queue: collections.deque = collections.deque()
        # request id → (future, deadline, problem id, taken by the process yet)
        self._waiting: dict[int, tuple[Future, float, str, bool]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._thread = threading.Thread(target=self._run, args=(keys, max_frame),
                                        name="served-rewards",
                                        daemon=True)
        self._thread.start()

    def submit(self, part: str, problem: Problem, completion: str) -> Future:
        """Score ``completion`` with ``part`` ("model" | "judge"); the Future never raises."""
        future: Future = Future()
        req = RewardRequest(next(self._ids), part, problem.prompt, problem.answer, completion)
        with self._lock:
            if self._closed:
                raise RuntimeError("ServedRewards.submit after close()")
            self._queue.append((req, future, time.monotonic() + QUEUED * self.cfg.timeout_s,
                                problem.id))
        os.write(self._wake_w, b"x")
        return future

    def close(self) -> None:
        with self._lock:
            self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self, keys: Keys, max_frame: int) -> None:
        sock = reward_client(self.addr, self.name, keys, max_frame)
        poller = zmq.Poller()
        poller.register(sock.sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._closed:
            self._send_queued(sock)
            nearest = min((d for _, d, _, _ in self._waiting.values()), default=math.inf)
            wait_ms = int(min(0.1, max(0.0, nearest - time.monotonic())) * 1000)
            ready = dict(poller.poll(wait_ms))
            if self._wake_r in ready:
                self._drain_wake()
            while sock.sock in ready:
                msg = sock.recv(0)
                if msg is None:
                    break
                self._on_reply(msg)
            self._expire()
        sock.close()
        for future, _, _, _ in self._waiting.values():
            settle(future, RewardResult(0.0, "error", "reward client closed"))

    def _send_queued(self, sock) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                req, future, deadline, pid = self._queue.popleft()
            self._waiting[req.request_id] = (future, deadline, pid, False)
            # 10000 requests already queued for a process that is not reading
            if not sock.try_send(req):
                self._finish(req.request_id,
                             RewardResult(0.0, "error", f"the {PROCESS} process takes no requests"))

    def _on_reply(self, msg) -> None:
        if getattr(msg, "request_id", None) not in self._waiting:
            return  # a late reply to a call that already timed out
        if isinstance(msg, RewardTaken):
            future, _, pid, _ = self._waiting[msg.request_id]
            self._waiting[msg.request_id] = (future, time.monotonic() + self.cfg.timeout_s, pid,
                                             True)
            return
        if not isinstance(msg, RewardReply):
            return
        info = {"batch": msg.batch, "batch_workers": msg.batch_workers}
        score = float(msg.score) if math.isfinite(msg.score) else 0.0
        status = msg.status if math.isfinite(msg.score) else "nonfinite"
        self._finish(msg.request_id, RewardResult(score, status, msg.detail, parts=info))

    def _expire(self) -> None:
        now = time.monotonic()
        t = self.cfg.timeout_s
        expired = [(rid, taken) for rid, (_, deadline, _, taken) in self._waiting.items()
                   if now >= deadline]
        for rid, taken in expired:
            why = (f"no reply from the {PROCESS} process within reward.timeout_s={t:g}s of its "
                   "taking the call" if taken else
                   f"the {PROCESS} process did not take the call within {QUEUED} × "
                   f"reward.timeout_s={QUEUED * t:g}s (busy with other calls, hung or dead; "
                   f"see logs/{PROCESS}.log)")
            self._finish(rid, RewardResult(0.0, "timeout", why))

    def _finish(self, rid: int, result: RewardResult) -> None:
        future, _, pid, _ = self._waiting.pop(rid)
        if result.status != "ok":
            counter = {"timeout": "timeouts", "parse_error": "parse_errors"}.get(result.status,
                                                                                 "errors")
            setattr(self, counter, getattr(self, counter) + 1)
            logger.warning("reward %s for problem %s: %s", result.status, pid, result.detail)
        settle(future, result)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                continue
        except BlockingIOError:
            return

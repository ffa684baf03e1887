"""What every process of a run does the same way: logging, stack dumps, the status link, threads."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from areal_cli.transport.auth import Keys
from areal_cli.transport.channels import Endpoints, status_sender
from areal_cli.transport.messages import Heartbeat, Phase


def setup_process(name: str, run_dir: str | Path) -> logging.Logger:
    """Log lines to stderr (the launcher sends it to logs/<name>.log); SIGUSR1 dumps every stack."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                        format=f"%(asctime)s {name} %(levelname)s %(message)s", datefmt="%H:%M:%S")
    die_with_parent()
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    for noisy in ("httpx", "urllib3", "transformers", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return logging.getLogger(name)


SWITCH_INTERVAL_S = 0.0005
"""The GIL switch interval of a process whose threads must answer while another one is busy
(Python's default: 5 ms, which a thread waiting for the GIL can wait several times over per call);
with the main thread busy, ``benchmarks/gil_switch.py`` serves more calls per second at the shorter
interval (BENCHMARKS.md "Small costs behind defaults")."""


def short_gil_switch() -> None:
    """Lower this process's GIL switch interval to ``SWITCH_INTERVAL_S`` (never raise it): a vLLM
    rollout worker (vLLM's output thread beside the stepping loop, the agent endpoint's thread) and
    vLLM's engine process (a weight update received by a thread beside the engine's loop)."""
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))


def exit_now(code: int = 0) -> None:
    """Flush stdout/stderr and end the process with ``code``, skipping the interpreter's
    finalization.

    A gloo worker thread can still be releasing a finished collective's tensors while the main
    thread finalizes the interpreter; taking the GIL then ends that thread inside a noexcept
    destructor and the process aborts ("terminate called without an active exception", SIGABRT)
    after all its work is done; a few two-rank gloo training steps in a few hundred ended so."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_main(main) -> None:
    """Run a process's main; any exception is printed and ends the process at once with code 1
    (a library thread that is still alive, e.g. an engine loop, must not keep a failed process
    hanging where the launcher cannot see it fail). Every end goes through ``exit_now``."""
    import traceback

    try:
        main()
    except SystemExit as err:  # sys.exit(): None is success, a message is printed and fails
        code = 0 if err.code is None else err.code
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        exit_now(code)
    except BaseException:  # noqa: BLE001 — report and exit, whatever it was
        traceback.print_exc()
        exit_now(1)
    exit_now(0)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Get ``sig`` when the parent dies (Linux prctl), so no process of a run outlives it."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)
    except OSError:
        pass
    if os.getppid() == 1:
        os._exit(3)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, Slurm's --cpus-per-task,
    a cpuset), not the machine's count, which oversubscribes a process pinned to a few cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API (macOS)
        return os.cpu_count() or 1


def physical_gpus(ids: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for GPU ids counted among this process's visible GPUs: under
    ``CUDA_VISIBLE_DEVICES=2,3`` (a scheduler's allocation, say), ids 0 and 1 are the cards 2 and
    3."""
    parent = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    return ",".join(parent[g] if g < len(parent) else str(g) for g in ids)


def set_threads(requested: int, share: int = 2) -> int:
    """torch CPU threads: ``requested`` or the usable cores divided among ``share`` processes."""
    import torch

    n = requested or max(1, usable_cores() // share)
    torch.set_num_threads(n)
    return n


class StatusLink:
    """A process's status channel to the controller: ``send`` puts one status message on it
    (``transport.messages.SENDERS`` lists them), and a daemon thread sends a ``Heartbeat``
    every ``period_s``.

    ``doing`` is what the process is busy with or waiting for, in words: the controller names it
    when the heartbeats stop. Where the controller acts on what a process does (a weight broadcast),
    ``set_doing`` also gives it as a ``Phase`` and the version it concerns; the words are never
    parsed. A beat proves only that the thread runs, so it also carries ``progress``, a counter of
    the main loop (advanced by ``advance()`` and by every new ``doing``), and, when the process sets
    ``busy`` (a callable: how much work it holds), that amount: the controller stops a run whose
    process holds work while its counter stands still (launcher.progress_timeout_s).
    The thread cannot die quietly: the launcher gone or the controller unreachable ends the process.
    """

    def __init__(self, endpoints: Endpoints, keys: Keys, name: str, period_s: float,
                 max_frame: int):
        self.name, self.period_s, self.progress = name, period_s, 0
        # one tuple: a beat reads it whole
        self._now: tuple[str, Phase, int] = ("starting", Phase.other, -1)
        self.busy: Callable[[], int] | None = None
        self.sock = status_sender(endpoints.status, name, keys, max_frame)
        self.lock = threading.Lock()
        self.parent = os.getppid()
        threading.Thread(target=self._run, daemon=True, name="heartbeat").start()

    @property
    def doing(self) -> str:
        return self._now[0]

    @doing.setter
    def doing(self, what: str) -> None:
        self.set_doing(what)

    def set_doing(self, what: str, phase: Phase = Phase.other, version: int = -1) -> None:
        """Now doing ``what`` (words for people), which is ``phase`` of weight ``version`` (for the
        controller)."""
        if (what, phase, version) != self._now:
            self._now = (what, phase, version)
            self.progress += 1

    def advance(self) -> None:
        """One unit of work done (a sequence finished, a result sent)."""
        self.progress += 1

    def send(self, msg) -> None:
        """Send one status message (its ``sender`` is this process's name)."""
        with self.lock:
            self.sock.send(msg)

    def _beat(self) -> Heartbeat:
        busy = -1
        if self.busy is not None:
            try:
                busy = int(self.busy())
            except Exception:  # noqa: BLE001 — a racy read of the main loop's state: say busy
                busy = 1
        what, phase, version = self._now
        return Heartbeat(self.name, what, self.progress, busy, phase, version)

    def _run(self) -> None:
        log = logging.getLogger(self.name)
        while True:
            time.sleep(self.period_s)
            if os.getppid() != self.parent:
                log.error("parent process died; exiting")
                os._exit(3)
            try:
                self.send(self._beat())
            except BaseException as err:  # noqa: BLE001 — a dead controller (or a bug here) ends this process
                log.error("heartbeat failed (%s: %s): controller unreachable; exiting",
                          type(err).__name__, err)
                sys.stderr.flush()
                os._exit(3)

"""The local launcher: start every process of a plan, watch them, tear all down on the first
failure (naming it, with its last log lines), or on Ctrl-C within ``launcher.stop_timeout_s``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from areal_cli.durable import atomic_write
from areal_cli.launcher.plan import Plan, child_env
from areal_cli.rundir import RunDir
from areal_cli.runtime import die_with_parent


def _term_with_launcher() -> None:
    """Children get SIGTERM when the launcher dies (torchrun then stops its ranks in order)."""
    die_with_parent(signal.SIGTERM)


class RunFailed(RuntimeError):
    def __init__(self, name: str, code: int, tail: str):
        self.name, self.code, self.tail = name, code, tail
        super().__init__(f"{name} exited with code {code}")

    @property
    def hint(self) -> str:
        """A line on a cause the exit code alone hides ("" where none is known)."""
        if self.code == -signal.SIGKILL or "Signal 9 (SIGKILL)" in self.tail:
            return ("it was killed by SIGKILL, which the run never sends first: most often the "
                    "kernel's out-of-memory killer (`dmesg` or `journalctl -k` says); lower the "
                    "host memory the run needs or give it more")
        return ""


def tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(lines[-n:])


class LocalLauncher:
    def __init__(self, plan: Plan, keep_fds: tuple[int, ...] = ()):
        self.plan = plan
        self.keep_fds = keep_fds  # the run lock: held until the last process of the run is gone
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def start(self) -> None:
        """The controller first (it binds every socket and publishes the addresses), then the
        rest."""
        ready = RunDir(self.plan.run_dir).controller_ready
        ready.unlink(missing_ok=True)
        self._spawn(self.plan.procs[0])
        deadline = time.monotonic() + self.plan.cfg.launcher.startup_timeout_s
        while not ready.exists():
            code = self.procs["controller"].poll()
            if code is not None:
                raise RunFailed("controller", code, self._failure_tail("controller"))
            if time.monotonic() > deadline:
                raise RunFailed("controller", -1,
                                "did not bind its sockets within launcher.startup_timeout_s")
            time.sleep(0.05)
        for p in self.plan.procs[1:]:
            self._spawn(p)
        atomic_write(RunDir(self.plan.run_dir).pids,
                     json.dumps({k: v.pid for k, v in self.procs.items()}))

    def _spawn(self, p) -> None:
        log = RunDir(self.plan.run_dir).log(p.name)
        self.logs[p.name] = log
        with log.open("ab") as out:
            self.procs[p.name] = subprocess.Popen(
                p.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=child_env(p.env), start_new_session=True, preexec_fn=_term_with_launcher,
                pass_fds=self.keep_fds)

    def poll(self) -> bool:
        """True when the run finished cleanly; raises RunFailed on the first failure."""
        for name, proc in self.procs.items():
            code = proc.poll()
            if code not in (None, 0):
                raise RunFailed(name, code, self._failure_tail(name))
        ctl = self.procs["controller"].poll()
        if ctl == 0:
            deadline = time.monotonic() + max(30.0, self.plan.cfg.launcher.stop_timeout_s)
            while time.monotonic() < deadline and any(p.poll() is None
                                                      for p in self.procs.values()):
                time.sleep(0.2)
            for name, proc in self.procs.items():
                if proc.poll() not in (None, 0):
                    raise RunFailed(name, proc.returncode, self._failure_tail(name))
            return True
        return False

    def _failure_tail(self, name: str) -> str:
        if name == "trainer":
            logs = sorted(self.plan.run_dir.glob("logs/trainer-*.log"))
            return "\n".join(f"--- {p.name}\n{tail(p, 15)}" for p in logs) or tail(self.logs[name])
        return tail(self.logs[name])

    def dump_stacks(self) -> None:
        """SIGUSR1 makes every live areal process write all its thread stacks to its log."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)  # a stopped process cannot dump
                    os.killpg(proc.pid, signal.SIGUSR1)
                except (ProcessLookupError, PermissionError):
                    pass

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM every process group, SIGKILL what is left after the timeout."""
        timeout_s = self.plan.cfg.launcher.stop_timeout_s if timeout_s is None else timeout_s
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.1)
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

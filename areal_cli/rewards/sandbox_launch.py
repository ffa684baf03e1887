"""Starting sandboxed scripts under bubblewrap, and ending every process they started.

The sandbox (isolation "bwrap"): new user (unless root), PID, network, IPC, UTS and cgroup
namespaces; an empty read-only root holding only /usr, the interpreter's own directory and the
sandbox's scripts, read-only; a fresh /proc; a tiny read-only /dev; a private size-limited tmpfs
/tmp as the only writable place; no capabilities; a seccomp filter (sandbox_seccomp.py); its own
session; killed with the reward worker (--die-with-parent). As root, bubblewrap runs without a
user namespace and the script drops to a uid of its own before any candidate code runs
(sandbox_child.become).

A code reward starts two such sandboxes at once (launch_pair): the candidate's program and the
test harness, joined only by two pipes. Limits hold for each whole tree, not per process:
rlimits in every process (RLIMIT_NPROC counts the tree's processes: a fresh user namespace, or
the call's own uid as root), and a watchdog (sandbox_watch.py) that sums each tree's CPU time,
memory and process count and kills every namespace of the call at the first excess, or at the
wall deadline. When a namespace's first process dies the kernel kills every other, so nothing
outlives the call.
"""

from __future__ import annotations

import functools
import marshal
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from areal_cli.rewards import sandbox_seccomp, sandbox_watch

HERE = Path(__file__).parent
SCRIPTS = ("sandbox_child.py", "sandbox_harness.py", "sandbox_values.py")
INSIDE = "/sandbox"
UID_BASE = 200_000
OUTPUT_TAIL = 2000
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}


@dataclass
class Run:
    code: int | None
    """The script's exit code; None when it was killed, or still ran when the call's last
    script ended."""
    killed: str
    """Why the watchdog killed the call ("" when it ended by itself)."""
    output: str
    """Tail of its stdout + stderr."""


@dataclass(frozen=True)
class Bwrap:
    """A bubblewrap executable, and how to run it (sandbox._probe picks what works here)."""

    path: str
    own_uid: bool
    """Root without a user namespace, the script dropping to a uid of its own (else: a new
    user namespace; also the fallback for a root that cannot switch uids, e.g. rootless)."""


def interpreter() -> str:
    """The bare interpreter behind this (maybe virtual-environment) Python."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def bwrap_argv(bwrap: Bwrap, tmp: int | str, extra: tuple[str, ...] = ()) -> list[str]:
    """The bubblewrap command line; /tmp is a tmpfs of `tmp` MiB, or (a str) that host directory;
    `extra`: more bubblewrap options (binds) before the root is made read-only."""
    argv = [bwrap.path, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            # fmt: skip
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if bwrap.own_uid:  # no user namespace: the script needs these two to drop to its own uid
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user"]
    argv += ["--tmpfs", "/", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    prefix = os.path.realpath(sys.base_prefix)
    if not prefix.startswith("/usr/"):
        argv += [a for p in reversed(Path(prefix).parents) for a in ("--dir", str(p))]
        argv += ["--ro-bind", prefix, prefix]
    argv += ["--dir", INSIDE]
    for name in SCRIPTS:
        argv += ["--ro-bind", str(HERE / name), f"{INSIDE}/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += (
        ["--bind", tmp, "/tmp"]
        if isinstance(tmp, str)
        else ["--size", str(tmp << 20), "--tmpfs", "/tmp"]
    )
    return argv + [*extra, "--remount-ro", "/", "--remount-ro", "/dev", "--chdir", "/tmp", "--"]


@functools.lru_cache(maxsize=4)
def sizes_tmpfs(bwrap: str) -> bool:
    """Whether this bubblewrap has --size (0.7 and later) for a size-limited tmpfs."""
    run = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    return "--size" in run.stdout + run.stderr


def launch(script: str, spec: dict, limits, bwrap: Bwrap | None) -> Run:
    """Run `script` with `spec` on stdin: under bubblewrap, or (bwrap None) as a plain process."""
    return launch_all([(script, spec, [])], limits, bwrap)[0]


def launch_pair(candidate: dict, harness: dict, limits, bwrap: Bwrap | None) -> tuple[Run, Run]:
    """The candidate's program (sandbox_child.py, mode "serve") and the test harness
    (sandbox_harness.py), each in a sandbox of its own, joined only by two pipes: requests
    (harness to candidate) and answers (candidate to harness). The call ends with the harness."""
    requests, answers = os.pipe(), os.pipe()
    served = dict(candidate, requests_fd=requests[0], answers_fd=answers[1])
    judged = dict(harness, requests_fd=requests[1], answers_fd=answers[0])
    jobs = [("sandbox_child.py", served, [requests[0], answers[1]]),
            ("sandbox_harness.py", judged, [requests[1], answers[0]])]  # fmt: skip
    first, last = launch_all(jobs, limits, bwrap)
    return first, last


@dataclass
class _Sandbox:
    """One started script."""

    proc: subprocess.Popen
    base: Path
    """Its host directory: output file, work directory (unsafe_none), seccomp program."""
    spec: bytes
    """What it reads on stdin."""
    info: int = -1
    """Where bubblewrap writes its --info-fd JSON (-1: no bubblewrap)."""
    init: tuple[int, list[int]] | None = None
    """The namespace's init: (host pid, [a pidfd of it])."""
    tmp: tuple[str, int] | None = None
    """Its size-limited /tmp: (its path seen from here, its size in bytes)."""
    pidfd: list[int] = field(default_factory=list)
    """[a descriptor readable once it ends] where the kernel has them."""
    code: int | None = None
    """Its exit code, when it ended before the call's last script did."""
    ended: bool = False


def launch_all(jobs: list[tuple[str, dict, list[int]]], limits, bwrap: Bwrap | None) -> list[Run]:
    """Start each (script, spec, fds) at once, each in a sandbox of its own with `fds` passed
    in (and closed here); watch all until the last one ends (the others are then ended) or any
    tree breaks a limit or the wall deadline (then all are killed)."""
    started: list[_Sandbox] = []
    try:
        try:
            for script, spec, fds in jobs:
                started.append(_start(script, dict(spec, limits=_limits(limits)), limits, bwrap,
                                      fds))
        finally:
            for fd in [fd for _, _, fds in jobs for fd in fds]:
                os.close(fd)
        for box in started:
            _ready(box, limits, bwrap)
        killed = sandbox_watch.watch(started, limits)
        for box in started:
            box.code = None if killed else box.proc.poll()
            _end(box)
        return [Run(box.code, killed, _tail(box.base / "output.txt")) for box in started]
    finally:
        for box in started:
            _end(box)
            shutil.rmtree(box.base, ignore_errors=True)


def _start(script: str, spec: dict, limits, bwrap: Bwrap | None, fds: list[int]) -> _Sandbox:
    """Start `script` (its spec follows in _ready, once the namespace's init is known)."""
    base = Path(tempfile.mkdtemp(prefix="areal_sandbox_"))
    info, own = -1, []
    try:
        if bwrap:  # bubblewrap says there which pid the namespace's init has
            info, info_write = os.pipe()
            own.append(info_write)
        argv = _command(script, spec, limits, bwrap, base, own)
        with (base / "output.txt").open("wb") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                pass_fds=[*fds, *own], start_new_session=True, env=ENV, cwd=base,
            )  # fmt: skip
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        if info >= 0:
            os.close(info)
        raise
    finally:
        for fd in own:
            os.close(fd)
    return _Sandbox(proc, base, marshal.dumps(spec), info, pidfd=_pidfd(proc.pid))


def _ready(box: _Sandbox, limits, bwrap: Bwrap | None) -> None:
    """Learn the namespace's init (before the program has its spec, so the init is still
    alive and its pid cannot have been reused), then feed the spec."""
    if box.info >= 0:
        box.init = _namespace_init(box.info, limits.wall_s)
        os.close(box.info)
        box.info = -1
        if box.init and sizes_tmpfs(bwrap.path):
            box.tmp = (f"/proc/{box.init[0]}/root/tmp", _tmp_mb(limits) << 20)
    try:
        box.proc.stdin.write(box.spec)
        box.proc.stdin.close()
    except BrokenPipeError:  # it died at start; its exit code and output tell why
        pass


def _namespace_init(info_fd: int, timeout_s: float) -> tuple[int, list[int]] | None:
    """The PID namespace's init, from bubblewrap's --info-fd JSON: (host pid, [a pidfd of it]
    where the kernel has them), or None when bubblewrap failed before making it. Called before
    the program has its spec, so the init is still alive and its pid cannot have been reused."""
    data, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # however slow a loaded machine makes bubblewrap's start
        if not select.select([info_fd], [], [], 0.1)[0]:
            continue
        chunk = os.read(info_fd, 4096)
        if not chunk:  # bubblewrap closes it once written (or exits)
            break
        data += chunk
    match = re.search(rb'"child-pid":\s*(\d+)', data)
    return (int(match.group(1)), _pidfd(int(match.group(1)))) if match else None


def _command(script: str, spec: dict, limits, bwrap: Bwrap | None, base: Path, fds: list) -> list:
    """The command line; completes `spec` (work directory, uid) and `fds` (to pass on)."""
    work = base / "work"
    work.mkdir()
    if not bwrap:
        spec.update(workdir=str(work), uid=None, isolated=False)
        spec["limits"]["nproc"] += _processes_of(os.getuid())
        return [interpreter(), "-I", "-S", "-B", str(HERE / script)]
    uid = UID_BASE + os.getpid() if bwrap.own_uid else None
    if uid is None and _kernel() < (5, 14):  # RLIMIT_NPROC counts all of the user's processes
        spec["limits"]["nproc"] += _processes_of(os.getuid())
    if uid is not None:
        os.chown(work, uid, uid)
    spec.update(workdir="/tmp", uid=uid, isolated=True)
    argv = bwrap_argv(bwrap, _tmp_mb(limits) if sizes_tmpfs(bwrap.path) else str(work))
    argv[-1:-1] = ["--info-fd", str(fds[0])]
    bpf = sandbox_seccomp.program()
    if bpf is not None:
        (base / "seccomp.bpf").write_bytes(bpf)
        fds.append(os.open(base / "seccomp.bpf", os.O_RDONLY))
        argv[-1:-1] = ["--seccomp", str(fds[-1])]
    return argv + [interpreter(), "-I", "-S", "-B", f"{INSIDE}/{script}"]


def _tmp_mb(limits) -> int:
    """The size of the sandbox's /tmp."""
    return 4 * limits.fsize_mb


def _limits(limits) -> dict:
    return dict(cpu_s=limits.cpu_s, mem_mb=limits.mem_mb, nproc=limits.nproc,
                fsize_mb=limits.fsize_mb)  # fmt: skip


def _end(box: _Sandbox) -> None:
    """Kill whatever is left of it (normally nothing) and return only once all of it is gone.

    Under bubblewrap: SIGKILL to the namespace's init, after which the kernel kills every other
    process of the namespace before the init itself counts as exited (bubblewrap's own exit
    does not wait for that). A plain process: its tree and its process group.
    """
    if box.ended:
        return
    box.ended = True
    if box.info >= 0:  # started, never made ready
        os.close(box.info)
    if box.init is not None:
        _kill_and_wait(*box.init)
    else:
        for p in sandbox_watch.tree(box.proc.pid):
            _kill(p)
        try:
            os.killpg(box.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group already ended
            pass
    try:
        box.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        box.proc.kill()
        box.proc.wait()
    for fd in box.pidfd:
        os.close(fd)


def _kill_and_wait(pid: int, fds: list[int], timeout_s: float = 10.0) -> None:
    if fds:  # race-free: the descriptor names that process even if its pid was reused
        try:
            signal.pidfd_send_signal(fds[0], signal.SIGKILL)
        except ProcessLookupError:  # it had already exited
            pass
        select.select(fds, [], [], timeout_s)
        os.close(fds[0])
        return
    _kill(pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.005)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # gone, or its pid already reused
        pass


def _pidfd(pid: int) -> list[int]:
    """[a descriptor readable when `pid` ends], or [] where the kernel has none (before 5.3)."""
    try:
        return [os.pidfd_open(pid)]
    except (AttributeError, OSError):
        return []


def _kernel() -> tuple[int, ...]:
    release = os.uname().release.split("-")[0].split(".")
    return tuple(int(x) for x in release[:2] if x.isdigit())


def _processes_of(uid: int) -> int:
    count = 0
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            count += os.stat(f"/proc/{name}").st_uid == uid
        except FileNotFoundError:
            continue
    return count


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - OUTPUT_TAIL))
        return f.read().decode("utf-8", errors="replace")

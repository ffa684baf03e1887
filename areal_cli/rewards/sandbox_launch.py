"""Starting one sandboxed script under bubblewrap, and watching its whole process tree.

The sandbox (isolation "bwrap"): new user (unless root), PID, network, IPC, UTS and cgroup
namespaces; an empty read-only root holding only /usr, the interpreter's own directory and the
sandbox's scripts, read-only; a fresh /proc; a tiny /dev; a private size-limited tmpfs /tmp as
the only writable place; no capabilities; a seccomp filter (sandbox_seccomp.py); its own
session; killed with the reward worker (--die-with-parent). As root, bubblewrap runs without a
user namespace and the script drops to a uid of its own before any candidate code runs
(sandbox_child.become).

Limits hold for the whole tree, not per process: rlimits in every process (RLIMIT_NPROC counts
the tree's processes: a fresh user namespace, or the call's own uid as root), and a watchdog
here that sums the tree's CPU time, resident memory and process count every WATCH_S and kills
the namespace at the first excess, or at the wall deadline. When the namespace's first process
dies the kernel kills every other, so nothing outlives the call.
"""

from __future__ import annotations

import functools
import marshal
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from areal_cli.rewards import sandbox_seccomp

HERE = Path(__file__).parent
SCRIPTS = ("sandbox_child.py", "sandbox_verdict.py", "sandbox_values.py")
INSIDE = "/sandbox"
UID_BASE = 200_000
WATCH_S = 0.01
OUTPUT_TAIL = 2000
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    code: int | None
    """The script's exit code; None when it was killed."""
    killed: str
    """Why the watchdog killed it ("" when it ended by itself)."""
    output: str
    """Tail of its stdout + stderr."""
    records: str = ""
    """What it wrote to the records descriptor (mode "test" only)."""


def interpreter() -> str:
    """The bare interpreter behind this (maybe virtual-environment) Python."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def bwrap_argv(bwrap: str, tmp: int | str) -> list[str]:
    """The bubblewrap command line; /tmp is a tmpfs of `tmp` MiB, or (a str) that host directory."""
    root = os.geteuid() == 0
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]  # fmt: skip
    if root:  # no user namespace: the script needs these two to drop to its own uid
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
    return argv + ["--remount-ro", "/", "--chdir", "/tmp", "--"]


@functools.lru_cache(maxsize=4)
def sizes_tmpfs(bwrap: str) -> bool:
    """Whether this bubblewrap has --size (0.7 and later) for a size-limited tmpfs."""
    run = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    return "--size" in run.stdout + run.stderr


def launch(script: str, spec: dict, limits, bwrap: str | None) -> Run:
    """Run `script` with `spec` on stdin: under bubblewrap, or (bwrap None) as a plain process."""
    base = Path(tempfile.mkdtemp(prefix="areal_sandbox_"))
    read_end, write_end = os.pipe()
    fds = [write_end]
    try:
        spec = dict(spec, limits=_limits(limits), records_fd=write_end)
        argv = _command(script, spec, limits, bwrap, base, fds)
        with (base / "output.txt").open("wb") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                pass_fds=fds, start_new_session=True, env=ENV, cwd=base,
            )  # fmt: skip
            for fd in fds:
                os.close(fd)
            fds = []
            code, killed, records = _watch(proc, marshal.dumps(spec), read_end, limits, bool(bwrap))
        return Run(code, killed, _tail(base / "output.txt"), records)
    finally:
        for fd in [read_end, *fds]:
            os.close(fd)
        shutil.rmtree(base, ignore_errors=True)


def _command(script: str, spec: dict, limits, bwrap: str | None, base: Path, fds: list) -> list:
    """The command line; completes `spec` (work directory, uid) and `fds` (to pass on)."""
    work = base / "work"
    work.mkdir()
    if not bwrap:
        spec.update(workdir=str(work), uid=None, isolated=False)
        spec["limits"]["nproc"] += _processes_of(os.getuid())
        return [interpreter(), "-I", "-S", "-B", str(HERE / script)]
    uid = UID_BASE + os.getpid() if os.geteuid() == 0 else None
    if uid is not None:
        os.chown(work, uid, uid)
    spec.update(workdir="/tmp", uid=uid, isolated=True)
    argv = bwrap_argv(bwrap, 4 * limits.fsize_mb if sizes_tmpfs(bwrap) else str(work))
    bpf = sandbox_seccomp.program()
    if bpf is not None:
        (base / "seccomp.bpf").write_bytes(bpf)
        fds.append(os.open(base / "seccomp.bpf", os.O_RDONLY))
        argv[-1:-1] = ["--seccomp", str(fds[-1])]
    return argv + [interpreter(), "-I", "-S", "-B", f"{INSIDE}/{script}"]


def _limits(limits) -> dict:
    return dict(cpu_s=limits.cpu_s, mem_mb=limits.mem_mb, nproc=limits.nproc,
                fsize_mb=limits.fsize_mb)  # fmt: skip


def _watch(proc: subprocess.Popen, spec: bytes, records_fd: int, limits, isolated: bool):
    """Feed the spec, collect the records, enforce the tree's limits; (code, killed, records)."""
    try:
        proc.stdin.write(spec)
        proc.stdin.close()
    except BrokenPipeError:  # it died at start; its exit code and output tell why
        pass
    pidfd = os.pidfd_open(proc.pid)
    records, cap = bytearray(), limits.fsize_mb << 20
    deadline, killed = time.monotonic() + limits.wall_s, ""
    try:
        while proc.poll() is None:
            ready, _, _ = select.select([records_fd, pidfd], [], [], WATCH_S)
            if records_fd in ready:
                records += os.read(records_fd, 1 << 16)
            killed = _over(proc.pid, limits, len(records) > cap, time.monotonic() > deadline)
            if killed:
                break
    finally:
        _end(proc, isolated)
        os.close(pidfd)
    os.set_blocking(records_fd, False)
    try:
        while len(records) <= cap and (chunk := os.read(records_fd, 1 << 16)):
            records += chunk
    except BlockingIOError:  # a process outside the namespace (unsafe_none) still holds it
        pass
    code = None if killed else proc.returncode
    return code, killed, records[:cap].decode("utf-8", errors="replace")


def _over(pid: int, limits, records_too_big: bool, late: bool) -> str:
    """Why the tree must die now, or ""."""
    if late:
        return f"wall time {limits.wall_s}s exceeded"
    if records_too_big:
        return f"more than {limits.fsize_mb} MiB of call records"
    procs, cpu_s, rss_mb = _usage(_tree(pid))
    if procs > limits.nproc + 3:  # + bwrap, its namespace init, the script's first process
        return f"{procs} processes (limit {limits.nproc})"
    if cpu_s > limits.cpu_s + 0.5:
        return f"{cpu_s:.1f} CPU seconds across its processes (limit {limits.cpu_s})"
    if rss_mb > limits.mem_mb:
        return f"{rss_mb:.0f} MiB resident across its processes (limit {limits.mem_mb} MiB)"
    return ""


def _tree(pid: int) -> list[int]:
    """`pid` and every process below it (through /proc/<pid>/task/<tid>/children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:  # it ended while we looked
            continue
    return found


def _usage(pids: list[int]) -> tuple[int, float, float]:
    """(processes, CPU seconds incl. reaped children, resident MiB) of `pids`."""
    procs, ticks, pages = 0, 0, 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        procs += 1
        ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        pages += int(fields[21])  # rss
    return procs, ticks / TICK, pages * PAGE / (1 << 20)


def _end(proc: subprocess.Popen, isolated: bool) -> None:
    """Kill whatever is left of the tree (normally nothing) and return once it is all gone.

    Under bubblewrap the first process is spared: it waits for the namespace's init, whose exit
    the kernel holds until every process of the namespace is dead, so its own exit means that.
    """
    for p in _tree(proc.pid)[1 if isolated else 0 :]:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # gone, or its pid already reused
            continue
    if not isolated:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group already ended
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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

"""Starting one sandboxed script under bubblewrap, and watching its whole process tree.

The sandbox (isolation "bwrap"): new user (unless root), PID, network, IPC, UTS and cgroup
namespaces; an empty read-only root holding only /usr, the interpreter's own directory and the
sandbox's scripts, read-only; a fresh /proc; a tiny read-only /dev; a private size-limited tmpfs
/tmp as the only writable place; no capabilities; a seccomp filter (sandbox_seccomp.py: no
memfd or SysV shared memory, which no resident size shows); its own
session; killed with the reward worker (--die-with-parent). As root, bubblewrap runs without a
user namespace and the script drops to a uid of its own before any candidate code runs
(sandbox_child.become).

Limits hold for the whole tree, not per process: rlimits in every process (RLIMIT_NPROC counts
the tree's processes: a fresh user namespace, or the call's own uid as root), and a watchdog
here that sums the tree's CPU time, memory and process count every WATCH_S and kills the
namespace at the first excess, or at the wall deadline. Memory is every byte the program can
hold: each process's proportional set size (shared memory and mapped tmpfs files included, a
page shared by two processes counted once), plus the files in its /tmp. When the namespace's first process
dies the kernel kills every other, so nothing outlives the call.
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


def bwrap_argv(bwrap: Bwrap, tmp: int | str) -> list[str]:
    """The bubblewrap command line; /tmp is a tmpfs of `tmp` MiB, or (a str) that host directory."""
    argv = [bwrap.path, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]  # fmt: skip
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
    return argv + ["--remount-ro", "/", "--remount-ro", "/dev", "--chdir", "/tmp", "--"]


@functools.lru_cache(maxsize=4)
def sizes_tmpfs(bwrap: str) -> bool:
    """Whether this bubblewrap has --size (0.7 and later) for a size-limited tmpfs."""
    run = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    return "--size" in run.stdout + run.stderr


def launch(script: str, spec: dict, limits, bwrap: Bwrap | None) -> Run:
    """Run `script` with `spec` on stdin: under bubblewrap, or (bwrap None) as a plain process."""
    base = Path(tempfile.mkdtemp(prefix="areal_sandbox_"))
    read_end, write_end = os.pipe()
    info_end, fds = -1, [write_end]
    try:
        if bwrap:  # bubblewrap says there which pid the namespace's init has
            info_end, info_write = os.pipe()
            fds.append(info_write)
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
            init = _namespace_init(info_end, limits.wall_s) if bwrap else None
            tmp = f"/proc/{init[0]}/root/tmp" if init and sizes_tmpfs(bwrap.path) else None
            code, killed, records = _watch(proc, marshal.dumps(spec), read_end, limits, init, tmp)
        return Run(code, killed, _tail(base / "output.txt"), records)
    finally:
        for fd in [read_end, *fds] + ([info_end] if info_end >= 0 else []):
            os.close(fd)
        shutil.rmtree(base, ignore_errors=True)


def _namespace_init(info_fd: int, timeout_s: float) -> tuple[int, list[int]] | None:
    """The PID namespace's init, from bubblewrap's --info-fd JSON: (host pid, [a pidfd of it]
    where the kernel has them), or None when bubblewrap failed before making it. Called before
    the program has its spec, so the init is still alive and its pid cannot have been reused."""
    data, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline and select.select([info_fd], [], [], 0.1)[0]:
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
    argv = bwrap_argv(bwrap, 4 * limits.fsize_mb if sizes_tmpfs(bwrap.path) else str(work))
    argv[-1:-1] = ["--info-fd", str(fds[-1])]
    bpf = sandbox_seccomp.program()
    if bpf is not None:
        (base / "seccomp.bpf").write_bytes(bpf)
        fds.append(os.open(base / "seccomp.bpf", os.O_RDONLY))
        argv[-1:-1] = ["--seccomp", str(fds[-1])]
    return argv + [interpreter(), "-I", "-S", "-B", f"{INSIDE}/{script}"]


def _limits(limits) -> dict:
    return dict(cpu_s=limits.cpu_s, mem_mb=limits.mem_mb, nproc=limits.nproc,
                fsize_mb=limits.fsize_mb)  # fmt: skip


def _watch(proc: subprocess.Popen, spec: bytes, records_fd: int, limits, init, tmp: str | None):
    """Feed the spec, collect the records, enforce the tree's limits; (code, killed, records).
    `init`: the namespace's init under bubblewrap (None for a plain process); `tmp`: its
    size-limited /tmp, seen from here (None where there is none)."""
    try:
        proc.stdin.write(spec)
        proc.stdin.close()
    except BrokenPipeError:  # it died at start; its exit code and output tell why
        pass
    pidfd = _pidfd(proc.pid)  # wakes the select below the moment the process ends
    records, cap = bytearray(), limits.fsize_mb << 20
    deadline, killed = time.monotonic() + limits.wall_s, ""
    try:
        while proc.poll() is None:
            ready, _, _ = select.select([records_fd, *pidfd], [], [], WATCH_S)
            if records_fd in ready:
                records += os.read(records_fd, 1 << 16)
            late = time.monotonic() > deadline
            killed = _over(proc.pid, limits, len(records) > cap, late, tmp)
            if killed:
                break
    finally:
        _end(proc, init)
        for fd in pidfd:
            os.close(fd)
    os.set_blocking(records_fd, False)
    try:
        while len(records) <= cap and (chunk := os.read(records_fd, 1 << 16)):
            records += chunk
    except BlockingIOError:  # a process outside the namespace (unsafe_none) still holds it
        pass
    code = None if killed else proc.returncode
    return code, killed, records[:cap].decode("utf-8", errors="replace")


def _over(pid: int, limits, records_too_big: bool, late: bool, tmp: str | None) -> str:
    """Why the tree must die now, or ""."""
    if late:
        return f"wall time {limits.wall_s}s exceeded"
    if records_too_big:
        return f"more than {limits.fsize_mb} MiB of call records"
    procs, cpu_s, mem_mb = _usage(_tree(pid))
    if procs > limits.nproc + 3:  # + bwrap, its namespace init, the script's first process
        return f"{procs} processes (limit {limits.nproc})"
    if cpu_s > limits.cpu_s + 0.5:
        return f"{cpu_s:.1f} CPU seconds across its processes (limit {limits.cpu_s})"
    mem_mb += _used_mb(tmp) if tmp else 0
    if mem_mb > limits.mem_mb:
        return f"{mem_mb:.0f} MiB across its processes and /tmp (limit {limits.mem_mb} MiB)"
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
    """(processes, CPU seconds incl. reaped children, proportional set size in MiB) of `pids`."""
    procs, ticks, mem_mb = 0, 0, 0.0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        procs += 1
        ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        mem_mb += _pss_mb(p, int(fields[21]))
    return procs, ticks / TICK, mem_mb


def _pss_mb(pid: int, rss_pages: int) -> float:
    """The process's proportional set size (Pss: anonymous, file and shared memory, each page
    divided among the processes mapping it); its resident size where the kernel shows no Pss."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:  # it ended while we looked, or a kernel before 4.14
        pass
    return rss_pages * PAGE / (1 << 20)


def _used_mb(path: str) -> float:
    """MiB held by the files of the file system at `path` (the sandbox's tmpfs /tmp)."""
    try:
        st = os.statvfs(path)
    except OSError:  # the namespace is gone
        return 0.0
    return (st.f_blocks - st.f_bfree) * st.f_frsize / (1 << 20)


def _end(proc: subprocess.Popen, init: tuple[int, list[int]] | None) -> None:
    """Kill whatever is left (normally nothing) and return only once all of it is gone.

    Under bubblewrap: SIGKILL to the namespace's init, after which the kernel kills every other
    process of the namespace before the init itself counts as exited (bubblewrap's own exit
    does not wait for that). A plain process: its tree and its process group.
    """
    if init is not None:
        _kill_and_wait(*init)
    else:
        for p in _tree(proc.pid):
            _kill(p)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group already ended
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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

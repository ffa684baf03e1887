"""The watchdog of sandboxed calls: what each process tree uses, summed, every WATCH_S.

Memory is every byte a program can hold: each process's proportional set size (anonymous,
file-backed and shared memory; a page two processes share counted once) plus the files in the
sandbox's size-limited /tmp. What no process's size shows and no file holds (memfd, SysV shared
memory) the seccomp filter refuses (sandbox_seccomp.py).
"""

from __future__ import annotations

import os
import select
import time

WATCH_S = 0.01
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def watch(boxes: list, limits) -> str:
    """Until the last of `boxes` (sandbox_launch._Sandbox) ends: why the call must die now
    (a tree over a limit, the wall deadline), or "" once the last one ended by itself."""
    deadline = time.monotonic() + limits.wall_s
    while boxes[-1].proc.poll() is None:
        running = [box for box in boxes if box.proc.poll() is None]
        # a pidfd wakes this the moment a process ends
        select.select([fd for box in running for fd in box.pidfd], [], [], WATCH_S)
        if time.monotonic() > deadline:
            return f"wall time {limits.wall_s}s exceeded"
        for box in running:
            killed = over(box.proc.pid, limits, box.tmp)
            if killed:
                return killed
    return ""


def over(pid: int, limits, tmp: tuple[str, int] | None) -> str:
    """Why the tree under `pid` must die now, or ""."""
    procs, cpu_s, mem_mb = usage(tree(pid))
    if procs > limits.nproc + 3:  # + bwrap, its namespace init, the script's first process
        return f"{procs} processes (limit {limits.nproc})"
    if cpu_s > limits.cpu_s + 0.5:
        return f"{cpu_s:.1f} CPU seconds across its processes (limit {limits.cpu_s})"
    mem_mb += used_mb(tmp) if tmp else 0
    if mem_mb > limits.mem_mb:
        return f"{mem_mb:.0f} MiB across its processes and /tmp (limit {limits.mem_mb} MiB)"
    return ""


def tree(pid: int) -> list[int]:
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


def usage(pids: list[int]) -> tuple[int, float, float]:
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
        mem_mb += pss_mb(p, int(fields[21]))
    return procs, ticks / TICK, mem_mb


def pss_mb(pid: int, rss_pages: int) -> float:
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


def used_mb(tmp: tuple[str, int]) -> float:
    """MiB held by the files of the sandbox's tmpfs: (its path seen from here, its size in
    bytes). While bubblewrap still builds the sandbox, that path shows the host's /tmp, of
    another size: nothing is counted then (the program has not started)."""
    try:
        st = os.statvfs(tmp[0])
    except OSError:  # the namespace is gone
        return 0.0
    if st.f_blocks * st.f_frsize != tmp[1]:
        return 0.0
    return (st.f_blocks - st.f_bfree) * st.f_frsize / (1 << 20)

"""What this machine has, for the checks of settings that must not exceed it
(``runconfig/compose.py``, ``RewardConfig.validate``): the CPU cores this process may run on, the
physical memory, and the most tasks (processes and threads) the kernel allows. Read from the kernel;
no torch import."""

from __future__ import annotations

import os
from functools import cache


@cache
def cores() -> int:
    """CPU cores this process may run on (its affinity: a container's or taskset's share)."""
    return len(os.sched_getaffinity(0))


@cache
def memory_mb() -> int:
    """Physical memory in MiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)


@cache
def tasks_max() -> int:
    """The most tasks the kernel allows at once (``/proc/sys/kernel/threads-max``)."""
    try:
        with open("/proc/sys/kernel/threads-max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 22  # the kernel's own ceiling for pid numbers on 64-bit

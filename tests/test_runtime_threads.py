"""Thread counts follow the cores a process may run on, not the machine's core count."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                reason="needs Linux CPU affinity")


def test_threads_follow_the_affinity_of_a_pinned_process():
    # a process pinned to one core (taskset, Slurm --cpus-per-task) gets one torch thread per
    # process, however many cores the machine has
    code = (
        "import os, torch\n"
        "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
        "from areal_cli.runtime import set_threads, usable_cores\n"
        "print(usable_cores(), set_threads(0, share=1), torch.get_num_threads())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["1", "1", "1"]


def test_an_explicit_thread_count_wins():
    code = "from areal_cli.runtime import set_threads; print(set_threads(3, share=2))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "3"

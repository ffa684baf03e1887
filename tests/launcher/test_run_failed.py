"""A process that dies of SIGKILL (itself, or a trainer rank under torchrun, which exits 1 and
logs the signal) is reported with the usual sender and where to check; other failures are not."""

from __future__ import annotations

import signal

from areal_cli.launcher.local import RunFailed

TORCHRUN_TAIL = """  exitcode  : -9 (pid: 2951)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 2951"""


def test_sigkill_names_the_out_of_memory_killer():
    assert "out-of-memory" in RunFailed("rollout-0", -signal.SIGKILL, "").hint
    assert "out-of-memory" in RunFailed("trainer", 1, TORCHRUN_TAIL).hint


def test_other_failures_get_no_guess():
    assert RunFailed("trainer", 1, "ValueError: bad batch").hint == ""
    assert RunFailed("rollout-0", -signal.SIGTERM, "").hint == ""

"""Running model-written Python where it can harm nothing, and deciding if its tests passed.

Isolation (reward.sandbox): "bwrap" (bubblewrap: namespaces, an empty read-only root, no
network, no capabilities, whole-tree limits; see sandbox_launch.py) or "unsafe_none" (a plain
child process with rlimits: any program can read, write and signal what the reward worker can;
only as an explicit opt-in, logged at start and on every result). With "bwrap" and no working
bubblewrap, nothing runs: `require` raises SandboxUnavailable naming the fix.

The verdict is decided outside the candidate (run_tests): the candidate's program runs in one
sandbox and the problem's tests in another (sandbox_harness.py), with no candidate code in it;
the tests call the candidate's functions through a pipe, arguments and results crossing as
plain values only. The candidate never holds a test or an expected value, and the harness's
exit code, not anything the candidate could write, says "passed".
"""

from __future__ import annotations

import ast
import functools
import logging
import os
import shutil
import signal
from dataclasses import dataclass

from areal_cli.config.task import SANDBOXES, RewardConfig, TaskConfig
from areal_cli.rewards.sandbox_launch import Bwrap, Run, launch, launch_pair

logger = logging.getLogger(__name__)
ISOLATIONS = ("bwrap", "unsafe_none")
UNSAFE = "UNSAFE: model-written code runs with NO isolation (reward.sandbox=unsafe_none)"
SETUP_ERROR = 125
FALLBACK = "or set reward.sandbox=unsafe_none to run model-written code without isolation (unsafe)"
"""The way out that an unavailable sandbox's message names (a caller of its own swaps it)."""


class SandboxUnavailable(ValueError):
    """reward.sandbox=bwrap, but bubblewrap is missing or cannot create its namespaces here."""


@dataclass
class Limits:
    """What one sandboxed call may use, summed over all of its processes."""

    cpu_s: int = 5
    """CPU seconds of the whole process tree (and RLIMIT_CPU of each process)."""
    wall_s: float = 8.0
    """Wall seconds before the whole process tree is killed."""
    mem_mb: int = 1024
    """Memory of the whole tree in MiB: its processes' Pss plus its /tmp files (and RLIMIT_AS
    of each process)."""
    nproc: int = 32
    """Processes of the whole tree (RLIMIT_NPROC in its own user namespace or uid)."""
    fsize_mb: int = 16
    """Largest file it may write, stdout included, in MiB (RLIMIT_FSIZE); /tmp holds 4x this."""


@dataclass
class SandboxResult:
    status: str
    """"passed" | "failed" | "timeout" | "error" (the sandbox itself failed)."""
    output: str
    """Tail of the program's stdout+stderr, then the sandbox's own lines ("[sandbox] ...")."""
    isolation: str = "bwrap"
    """Which isolation ran: "bwrap" | "unsafe_none"."""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def require(isolation: str) -> Bwrap | None:
    """How to run bubblewrap (None for unsafe_none); SandboxUnavailable naming the fix."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"reward.sandbox={isolation!r}: use one of {', '.join(ISOLATIONS)}")
    if isolation == "unsafe_none":
        return None
    bwrap, problem = _probe()
    if problem:
        raise SandboxUnavailable(problem)
    return bwrap


def sandbox_problems(reward: RewardConfig, task: TaskConfig, runs_code: bool = False) -> list[str]:
    """Runs that execute model-written code (reward.fn=code, fn=auto on HumanEval, a workflow that
    ``runs_code``, as tool_use) need a working reward.sandbox: the reason it is missing, with the
    fix, or []."""
    parts = reward.parts
    needs = "code" in parts or ("auto" in parts and task.source == "humaneval")
    if not (needs or runs_code) or reward.sandbox not in SANDBOXES:
        return []
    try:
        require(reward.sandbox)
    except SandboxUnavailable as e:
        return [str(e)]
    return []


def announce(isolation: str) -> None:
    """Log, once at start, which isolation model-written code will get."""
    if isolation == "unsafe_none":
        logger.warning("%s: it can read, write and signal anything this process can", UNSAFE)
    else:
        bwrap = require(isolation)
        mode = "own uid" if bwrap.own_uid else "user namespace"
        logger.info("code sandbox: bubblewrap (%s, %s)", bwrap.path, mode)


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[Bwrap | None, str]:
    """(how to run bubblewrap, "") when a trivial program runs under it here, else (None, why).
    Root tries its own-uid mode first, then a user namespace (a root that cannot switch uids)."""
    path = shutil.which("bwrap")
    if path is None:
        return None, (
            "reward.sandbox=bwrap needs bubblewrap, which is not installed: install the package "
            "(Debian/Ubuntu: apt-get install bubblewrap; Fedora/RHEL: dnf install bubblewrap), "
            f"{FALLBACK}"
        )
    why = ""
    for own_uid in (True, False) if os.geteuid() == 0 else (False,):
        try:
            run = launch(
                "sandbox_child.py",
                {"mode": "run", "program": "pass"},
                Limits(),
                Bwrap(path, own_uid),
            )
        except OSError as e:  # e.g. the uid of its own is not mapped in this user namespace
            why = f"{type(e).__name__}: {e}"
            continue
        if run.code == 0:
            return Bwrap(path, own_uid), ""
        why = run.output.strip()[-300:]
    return None, (
        f"bubblewrap ({path}) cannot create its sandbox here: {why!r}. "
        "It needs unprivileged user namespaces (sysctl user.max_user_namespaces > 0, "
        "kernel.unprivileged_userns_clone=1 where that exists; in a container: a seccomp "
        f"profile that allows them, e.g. docker --security-opt seccomp=unconfined), {FALLBACK}"
    )


def run_python(program: str, limits: Limits, isolation: str = "bwrap") -> SandboxResult:
    """Run `program` (the tool_use workflow shows its output); status "passed" = it ran to its
    end, as the program itself says: never a reward. Never raises on the program's behalf."""
    bwrap = require(isolation)
    run = launch("sandbox_child.py", {"mode": "run", "program": program}, limits, bwrap)
    return _result(run, "passed" if run.code == 0 else "failed", isolation)


def run_tests(program: str, test: str, entry: str, prefix: str, limits: Limits,
              isolation: str = "bwrap") -> SandboxResult:  # fmt: skip
    """Run `program` in one sandbox and `test` (then `check(entry)` when entry is set) in
    another, the tests calling the program's functions through a pipe; "passed" only when the
    tests pass on the plain values the candidate answered."""
    bwrap = require(isolation)
    names = targets(program, prefix, entry)
    candidate = {"mode": "serve", "program": program, "targets": names}
    harness = {"prefix": prefix, "test": test, "entry": entry, "targets": names}
    served, judged = launch_pair(candidate, harness, limits, bwrap)
    output = served.output + judged.output
    if signal_of(served.code):  # e.g. SIGXCPU: the harness then saw its answers stop
        name = signal_of(served.code)
        cpu = " (CPU time)" if name == "SIGXCPU" else ""
        output += f"[sandbox] killed by {name}{cpu}: the candidate's program\n"
    code = SETUP_ERROR if SETUP_ERROR in (served.code, judged.code) else judged.code
    run = Run(code, judged.killed, output)
    return _result(run, "passed" if code == 0 else "failed", isolation)


def targets(program: str, prefix: str, entry: str) -> list[str]:
    """The candidate's functions the tests call: the entry point, or (no entry point) every
    top-level function the program defines beyond the problem's own prefix."""
    if entry:
        return [entry]
    return sorted(_defined(program) - _defined(prefix))


def _defined(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # the program fails anyway
        return set()
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return {node.name for node in tree.body if isinstance(node, kinds)}


def signal_of(code: int | None) -> str:
    """The signal that ended a process: bubblewrap exits 128 + n, Popen reports -n."""
    number = -code if code is not None and code < 0 else (code or 0) - 128
    try:
        return signal.Signals(number).name if number > 0 else ""
    except ValueError:  # not a signal number: a plain exit code
        return ""


def _result(run: Run, status: str, isolation: str) -> SandboxResult:
    lines = [run.output] if run.output else []
    if run.killed:
        status = "timeout" if run.killed.startswith("wall") else "failed"
        lines.append(f"[sandbox] killed: {run.killed}")
    elif run.code == SETUP_ERROR:
        status = "error"
        lines.append("[sandbox] the sandbox could not start the program")
    elif signal_of(run.code):
        name = signal_of(run.code)
        lines.append(f"[sandbox] killed by {name}" + (" (CPU time)" if name == "SIGXCPU" else ""))
    lines.append(f"[sandbox] isolation: {isolation}")
    if isolation == "unsafe_none":
        logger.warning("%s; result %s", UNSAFE, status)
    return SandboxResult(status, "\n".join(lines)[-2000:], isolation)

"""Runs one untrusted program inside the sandbox; started by sandbox_launch.py, never imported.

Run by the bare interpreter (-I -S), importing as little as it can (each import is paid on
every call). Reads its spec (marshal, written by the trusted parent) on stdin; where the spec
names a uid (the reward worker is root, so bubblewrap ran without a user namespace), becomes
that uid, so it holds no capability and RLIMIT_NPROC counts this call's processes alone;
checks that no capability is left and that no new privilege can be gained (bubblewrap sets
no_new_privs); sets the rlimits; then runs the program.

mode "run": the program, its exceptions printed (the tool_use workflow shows the output).
mode "test": the program, then the problem's tests, with each candidate function the tests
call wrapped so that every call the tests make (arguments, and the return value or exception)
is written as a JSON line to the records descriptor. Nothing here decides the verdict: the
candidate shares this process and may write anything there; sandbox_verdict.py replays the
tests, in a process with no candidate code in it, on the plain values recorded.
"""

import marshal
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sandbox_values import NotPlain, dumps, encode  # noqa: E402 - stdlib-only sibling module

SETUP_ERROR = 125
MIB = 1024 * 1024


def main():
    spec = marshal.loads(sys.stdin.buffer.read())
    setup(spec)
    if spec["mode"] == "run":
        sys.exit(run(spec["program"]))
    sys.exit(run_tests(spec))


def setup(spec):
    """Before any program runs: no stdin, first in line for the OOM killer, the uid of its own
    (as root), no new privileges, the rlimits, the work directory. A failure here exits SETUP_ERROR (never the program's)."""
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        with open("/proc/self/oom_score_adj", "w") as f:  # the OOM killer's first pick, not a trainer
            f.write("1000")
        if spec.get("uid") is not None:
            if os.stat(spec["workdir"]).st_uid == 0:  # bwrap's tmpfs: let the new uid write there
                os.chmod(spec["workdir"], 0o1777)
            become(spec["uid"])
        if spec["isolated"]:
            check_unprivileged()
        set_limits(spec["limits"])
        os.chdir(spec["workdir"])
    except BaseException:  # noqa: BLE001 - reported through the exit code and the traceback
        print_exc()
        sys.stderr.flush()
        os._exit(SETUP_ERROR)


def become(uid):
    """Leave root for `uid`: the kernel then clears the permitted and effective capabilities."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def check_unprivileged():
    with open("/proc/self/status") as f:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    held = [k for k in ("CapPrm", "CapEff", "CapAmb") if int(status[k], 16)]
    if held or status.get("NoNewPrivs") != "1":
        raise PermissionError(f"still privileged: {held}, NoNewPrivs {status.get('NoNewPrivs')}")


def set_limits(limits):
    def cap(kind, value):
        resource.setrlimit(kind, (value, value))

    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    cap(resource.RLIMIT_AS, limits["mem_mb"] * MIB)
    cap(resource.RLIMIT_FSIZE, limits["fsize_mb"] * MIB)
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NOFILE, 256)
    cap(resource.RLIMIT_NPROC, limits["nproc"])


def run(program):
    try:
        exec(compile(program, "program.py", "exec"), {"__name__": "__main__"})
        return 0
    except SystemExit as e:
        return 0 if e.code in (0, None) else 1
    except BaseException:  # noqa: BLE001 - the program's own failure: shown, exit 1
        print_exc()
        return 1


def run_tests(spec):
    out = spec["records_fd"]
    names = {"in_call": False}
    g = {"__name__": "__main__"}
    try:
        exec(compile(spec["program"], "program.py", "exec"), g)
        for name in spec["targets"]:
            if callable(g.get(name)):
                g[name] = recorder(name, g[name], out, names)
        seed_random(spec["test"])
        exec(compile(spec["test"], "test.py", "exec"), g)
        if spec["entry"]:
            g["check"](g[spec["entry"]])
    except BaseException:  # noqa: BLE001 - a failing test: shown; the verdict replays it anyway
        print_exc()
        return 1
    write(out, {"end": True})
    return 0


def seed_random(test):
    """Tests that draw unseeded random inputs draw the same ones here and in the replay."""
    if "random" in test:
        import random

        random.seed(0)


def recorder(name, fn, out, state):
    """`fn`, writing one record per call made by the tests (not by the candidate itself)."""

    def call(*args, **kwargs):
        if state["in_call"]:
            return fn(*args, **kwargs)
        record = {"fn": name, "args": encode(list(args), True), "kwargs": encode(kwargs, True)}
        state["in_call"] = True
        try:
            result = fn(*args, **kwargs)
        except Exception as e:
            record["raise"] = [type(e).__name__, str(e)[:200]]
            write(out, record)
            raise
        finally:
            state["in_call"] = False
        try:
            record["out"] = encode(result)
        except NotPlain as e:
            record["not_plain"] = str(e)
        except RecursionError:
            record["not_plain"] = "a self-referencing container"
        record["after"] = encode(list(args), True)
        write(out, record)
        return result

    return call


def print_exc():
    import traceback  # only on failure: its imports cost more than the interpreter's start

    traceback.print_exc()


def write(fd, record):
    data = (dumps(record) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


if __name__ == "__main__":
    main()

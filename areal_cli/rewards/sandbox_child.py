"""Runs one untrusted program inside the sandbox; started by sandbox_launch.py, never imported.

Run by the bare interpreter (-I -S), importing as little as it can (each import is paid on
every call). Reads its spec (marshal, written by the trusted parent) on stdin; where the spec
names a uid (the reward worker is root, so bubblewrap ran without a user namespace), becomes
that uid, so it holds no capability and RLIMIT_NPROC counts this call's processes alone;
checks that no capability is left and that no new privilege can be gained (bubblewrap sets
no_new_privs); sets the rlimits; then runs the program.

mode "run": the program, its exceptions printed (the tool_use workflow shows the output).
mode "serve": the program, then its functions called on behalf of the problem's tests, which
run in a process and a sandbox of their own (sandbox_harness.py): each call's arguments arrive
as plain values over a pipe, and the return value (or the exception's name) goes back as plain
values. Nothing here decides the verdict, and nothing here holds a test or an expected value.
"""

import marshal
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sandbox_values import NotPlain, decode, dumps, encode, recv, send  # noqa: E402 - stdlib-only sibling

SETUP_ERROR = 125
MIB = 1024 * 1024


def main():
    spec = marshal.loads(sys.stdin.buffer.read())
    setup(spec)
    if spec["mode"] == "run":
        sys.exit(run(spec["program"]))
    sys.exit(serve(spec))


def setup(spec):
    """Before any program runs: no stdin, first in line for the OOM killer, the uid of its own
    (as root), no new privileges, the rlimits, the work directory. A failure here exits SETUP_ERROR
    (never the program's)."""
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        # the OOM killer's first pick, not a trainer
        with open("/proc/self/oom_score_adj", "w") as f:
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


def serve(spec):
    """The program, then its functions called for the test harness: one call per request frame
    (marshal, from the harness), one JSON answer frame each, until the harness closes its end.
    The tests are not in this process: what a call can see is its arguments."""
    g = {"__name__": "__main__"}
    try:
        exec(compile(spec["program"], "program.py", "exec"), g)
    except BaseException:  # noqa: BLE001 - the program's own failure: shown, the harness fails
        print_exc()
        return 1
    flush()
    while (frame := recv(spec["requests_fd"], 1 << 40)) is not None:
        reply = answer(g, spec["targets"], marshal.loads(frame))
        try:
            text = dumps(reply)
        except ValueError:  # an int with more digits than str() may write
            text = dumps({"not_plain": "int too long to send"})
        send(spec["answers_fd"], text.encode("utf-8", "surrogatepass"))
        flush()
    return 0


def answer(g, targets, request):
    """What one call returned (its arguments after it too: a list sorted in place), the
    exception it raised, or why there is no plain answer."""
    fn = g.get(request["fn"]) if request["fn"] in targets else None
    if not callable(fn):
        return {"missing": request["fn"]}
    args, kwargs = decode(request["args"]), decode(request["kwargs"])
    try:
        result = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the tests may expect it: sent by name
        return {"raise": [type(e).__name__, str(e)[:200]]}
    try:
        return {"out": encode(result), "after": encode(args)}
    except NotPlain as e:
        return {"not_plain": str(e)}
    except RecursionError:  # a self-referencing container
        return {"not_plain": "self-referencing container"}


def flush():
    sys.stdout.flush()
    sys.stderr.flush()


def print_exc():
    import traceback  # only on failure: its imports cost more than the interpreter's start

    traceback.print_exc()


if __name__ == "__main__":
    main()

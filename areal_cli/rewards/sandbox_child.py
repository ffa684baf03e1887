"""Runs one untrusted program under limits; started by sandbox.py, never imported.

Stdlib only. Reads a JSON spec on stdin, then, as root where the kernel permits:
new mount + network + PID namespaces (no network at all, every mount read-only except the
work directory), forks the program's process (PID 1 of its namespace, so the whole tree dies
with it), sets rlimits, switches to a uid of its own (so RLIMIT_NPROC binds) keeping only
CAP_DAC_READ_SEARCH (to read the interpreter under a 0700 home), and runs the program.
Without namespaces it falls back to an audit hook that refuses sockets, subprocesses, ctypes
and writes outside the work directory (best effort: audit hooks are no real boundary).
Exit code: 0 the program ran to its end, 1 it failed, 124 wall time, 125 setup error.
"""

import ctypes
import json
import os
import resource
import signal
import sys
import time
import traceback

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x00020000, 0x40000000, 0x20000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_KEEPCAPS, PR_SET_NO_NEW_PRIVS = 1, 8, 38
CAP_DAC_READ_SEARCH = 2
UID_BASE = 100_000
BLOCKED_EVENTS = {
    "socket.__new__", "socket.connect", "socket.bind", "subprocess.Popen", "os.system",
    "os.exec", "os.posix_spawn", "os.spawn", "ctypes.dlopen", "ctypes.dlsym", "os.kill",
}  # fmt: skip
PATH_EVENTS = {
    "open", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
    "os.chmod", "os.chown", "os.truncate", "shutil.rmtree", "os.utime",
}  # fmt: skip
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

libc = ctypes.CDLL(None, use_errno=True)


def log(msg):
    print(f"[sandbox] {msg}", file=sys.stderr, flush=True)


def main():
    spec = json.loads(sys.stdin.read())
    sys.stdin.close()
    workdir = spec["workdir"]
    isolated = spec["namespaces"] and os.geteuid() == 0 and isolate(workdir)
    log(f"isolation: {'namespaces' if isolated else 'audit hook (fallback)'}")
    uid = UID_BASE + os.getpid() if os.geteuid() == 0 else None
    if uid is not None:
        os.chown(workdir, uid, uid)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        run_child(spec, isolated, uid, write_end)
    os.close(write_end)
    code = supervise(pid, spec["wall_s"], read_end)
    if uid is not None and not isolated:  # with namespaces the kernel already killed them all
        reap(uid)
    sys.exit(code)


def isolate(workdir):
    """New mount, network and PID namespaces; every mount read-only except workdir."""
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID) != 0:
        log(f"unshare refused: {os.strerror(ctypes.get_errno())}")
        return False
    if not (mount(None, "/", MS_REC | MS_PRIVATE) and mount(workdir, workdir, MS_BIND | MS_REC)):
        return False
    ok = True
    for point in mount_points():
        if point != workdir and not mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY):
            ok = ok and point not in ("/", "/tmp", "/dev/shm", "/var/tmp", "/work")
    return ok


def mount(source, target, flags):
    src = source.encode() if source else None
    if libc.mount(src, target.encode(), None, flags, None) != 0:
        log(f"mount {target}: {os.strerror(ctypes.get_errno())}")
        return False
    return True


def mount_points():
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    decoded = [p.encode().decode("unicode_escape") for p in points]
    return list(dict.fromkeys(decoded))


def run_child(spec, isolated, uid, write_end):
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if isolated:
            become_init()
        os.chdir(spec["workdir"])
        set_limits(spec, uid)
        if uid is not None:
            drop_root(uid)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if not isolated:
            sys.addaudithook(audit_guard(os.path.realpath(spec["workdir"])))
        code = compile(spec["program"], os.path.join(spec["workdir"], "program.py"), "exec")
    except BaseException:  # noqa: BLE001 - setup failure is reported through the exit code
        traceback.print_exc()
        os._exit(125)
    os._exit(execute(code, write_end))


def become_init():
    """As PID 1 of the namespace (which ignores even RLIMIT_CPU's signals), fork the
    program's process and wait for it; returns only in that forked process."""
    pid = os.fork()
    if pid == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        return
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 1)


def execute(code, write_end):
    try:
        exec(code, {"__name__": "__main__"})
        passed = True
    except SystemExit:
        log("the program called exit(): counts as a failure")
        passed = False
    except BaseException:  # noqa: BLE001 - any exception of the program means "failed"
        traceback.print_exc()
        passed = False
    sys.stdout.flush()
    sys.stderr.flush()
    if passed:
        os.write(write_end, b"ok")
    return 0 if passed else 1


def set_limits(spec, uid):
    mib = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (spec["cpu_s"], spec["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (spec["mem_mb"] * mib, spec["mem_mb"] * mib))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec["fsize_mb"] * mib, spec["fsize_mb"] * mib))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    nproc = spec["nproc"] if uid is not None else spec["nproc"] + processes_of(os.getuid())
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def processes_of(uid):
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat(f"/proc/{name}").st_uid == uid
            except FileNotFoundError:
                continue
    return count


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]


def drop_root(uid):
    """Become `uid`, keeping only CAP_DAC_READ_SEARCH (read-only access to files)."""
    libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    keep = 1 << CAP_DAC_READ_SEARCH
    data = (CapData * 2)(CapData(keep, keep, 0), CapData(0, 0, 0))
    if libc.capset(ctypes.byref(CapHeader(0x20080522, 0)), data) != 0:
        log(f"capset: {os.strerror(ctypes.get_errno())}")
    libc.prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0)


def audit_guard(workdir):
    def inside(path):
        if isinstance(path, int):
            return True
        real = os.path.realpath(os.fsdecode(path))
        return real == "/dev/null" or real == workdir or real.startswith(workdir + os.sep)

    def hook(event, args):
        if event in BLOCKED_EVENTS:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event not in PATH_EVENTS:
            return
        if event == "open" and not is_write(args):
            return
        paths = [a for a in args[:2] if isinstance(a, str | bytes | os.PathLike)]
        if not all(inside(p) for p in paths):
            raise PermissionError(f"sandbox: {event} outside the work directory")

    return hook


def is_write(args):
    _, mode, flags = args
    return bool(flags & WRITE_FLAGS) or any(c in (mode or "") for c in "wax+")


def supervise(pid, wall_s, read_end):
    deadline = time.monotonic() + wall_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            os.set_blocking(read_end, False)  # a leftover grandchild may hold the write end
            try:
                marker = os.read(read_end, 2)
            except BlockingIOError:
                marker = b""
            return 0 if (marker == b"ok" and os.waitstatus_to_exitcode(status) == 0) else 1
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            log(f"wall time {wall_s}s exceeded: killed")
            return 124
        time.sleep(0.01)


def reap(uid):
    """Kill every process left running under the sandbox's uid (escaped sessions included)."""
    try:
        pid = os.fork()
    except OSError as e:  # e.g. inside a PID namespace whose init is gone
        log(f"reaper fork failed: {e}")
        return
    if pid == 0:
        os.setuid(uid)
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:  # nothing was left: the usual case
            os._exit(0)
        os._exit(0)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()

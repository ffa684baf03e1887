"""Starts one agent program (workflow.agent_cmd) or its verifier; run by program.py as
``python -I -S -B program_shim.py SPEC``, never imported. The standard library only.

SPEC (JSON): ``cmd`` (the shell command), ``mem_mb`` (RLIMIT_AS of every process it starts; 0 =
none), ``uid`` (a uid to become first: root's sandbox without a user namespace), ``cwd`` (a
directory to enter then), ``port`` and
``socket`` (inside the sandbox: serve 127.0.0.1:port, the endpoint's own port, by forwarding each
connection to the endpoint's Unix socket, the network namespace's only way out).

Without a forwarder the shim becomes the program (``/bin/sh -c cmd``); with one it forks the program
and exits with its exit code (128 + n for a signal), the forwarder ending with it.
"""

import json
import os
import resource
import socket
import sys
import threading

CHUNK = 1 << 16


def main():
    spec = json.loads(sys.argv[1])
    try:  # the OOM killer's first pick, not a trainer
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    listener = None
    if spec.get("socket"):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", spec["port"]))
        listener.listen(64)
    if spec.get("uid") is not None:  # the kernel then clears every capability
        os.setgroups([])
        os.setresgid(spec["uid"], spec["uid"], spec["uid"])
        os.setresuid(spec["uid"], spec["uid"], spec["uid"])
    if spec.get("cwd"):
        os.chdir(spec["cwd"])
    if listener is None:
        start(spec)
    pid = os.fork()
    if pid == 0:
        listener.close()
        start(spec)
    threading.Thread(target=serve, args=(listener, spec["socket"]), daemon=True).start()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def start(spec):
    """Become the program: its memory limit, then ``/bin/sh -c cmd``."""
    if spec["mem_mb"]:
        limit = spec["mem_mb"] << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.execv("/bin/sh", ["sh", "-c", spec["cmd"]])


def serve(listener, path):
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=pair, args=(conn, path), daemon=True).start()


def pair(conn, path):
    """One connection to 127.0.0.1:port, carried over a connection of its own to the socket."""
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        conn.close()
        return
    back = threading.Thread(target=pump, args=(up, conn), daemon=True)
    back.start()
    pump(conn, up)
    back.join()
    conn.close()
    up.close()


def pump(src, dst):
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


if __name__ == "__main__":
    main()

"""Hostile programs against the bubblewrap sandbox, as root and as an ordinary user (.ci/run
runs this file both ways). Each candidate's test passes only if its escape works, so "contained"
means: the host is untouched, the call scores 0, and nothing it started outlives the call.
Where the same program escapes with reward.sandbox=unsafe_none (no isolation), that run is the
control: it shows the check would catch the escape."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from areal_cli.config.task import RewardConfig
from areal_cli.rewards.code_reward import run_tests
from areal_cli.rewards.sandbox import SandboxResult
from areal_cli.tasks import Problem

# the tests that start sandboxed programs share one pytest-xdist worker (make test runs
# --dist loadgroup): the leftover checks of test_sandbox_escapes see every sandbox of the host
pytestmark = pytest.mark.xdist_group("sandbox")

FAST = RewardConfig(code_cpu_s=1, code_wall_s=3.0, code_mem_mb=512, code_nproc=16)
UNSAFE = RewardConfig(code_cpu_s=1, code_wall_s=3.0, code_mem_mb=512, sandbox="unsafe_none")
ROOT = os.geteuid() == 0


def attempt(body: str, escaped=True, cfg: RewardConfig = FAST) -> SandboxResult:
    """Run `def f(): <body>` against a test that passes only when f() returns `escaped`."""
    test = f"def check(f):\n    assert f() == {escaped!r}\n"
    problem = Problem("escape/0", "", "", {"test": test, "entry_point": "f"})
    completion = "def f():\n" + "".join(f"    {line}\n" for line in body.splitlines())
    return run_tests(completion, problem, cfg)


def contained(result: SandboxResult) -> bool:
    return result.isolation == "bwrap" and result.status != "passed"


def _is_sandboxed(cmdline: bytes) -> bool:
    return b"/sandbox/sandbox_" in cmdline or b"sleep\x0031.4159" in cmdline


def _this_tests(pid: int, cmdlines: dict[int, bytes]) -> bool:
    """Whether ``pid`` descends from this test process, or from nothing but orphaned sandbox
    processes (what an escape would leave: its parents gone, it hangs under init). Sandboxes of
    other processes (another pytest worker, another checkout's tests) descend from those."""
    while pid > 1:
        if pid == os.getpid():
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:  # it ended while we looked
            return False
        parent = int(stat.rsplit(b")", 1)[1].split()[1])
        if parent == 1:
            return _is_sandboxed(cmdlines.get(pid, b""))
        pid = parent
    return False


def sandbox_processes() -> set[int]:
    """Host processes of this test running a script inside bubblewrap (its path there is
    /sandbox/...) or this file's sleeper; the tests compare the sets before and after a call."""
    cmdlines = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdlines[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # it ended while we looked
            continue
    return {pid for pid, cmdline in cmdlines.items()
            if _is_sandboxed(cmdline) and _this_tests(pid, cmdlines)}


def left_behind(result_of, *args, **kwargs) -> tuple[SandboxResult, set[int]]:
    """`result_of(*args, **kwargs)` and the sandbox processes it left running."""
    before = sandbox_processes()
    result = result_of(*args, **kwargs)
    return result, sandbox_processes() - before


@pytest.fixture
def victim():
    """A process of the test's own user, holding a secret in its environment."""
    proc = subprocess.Popen(
        ["sleep", "60"], env={"AREAL_SECRET": "s3cret", "PATH": "/usr/bin:/bin"}
    )
    yield proc.pid
    proc.kill()
    proc.wait()


def test_reading_a_file_only_the_worker_may_read(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret")
    secret.chmod(0o600)
    body = f"return open({str(secret)!r}).read()"
    assert attempt(body, "s3cret", UNSAFE).passed  # control: without isolation it escapes
    assert contained(attempt(body, "s3cret"))


OPEN_BY_HANDLE = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class Handle(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint), ("type", ctypes.c_int), ("data", ctypes.c_ubyte * 128)]
handle, mount_id = Handle(128, 0), ctypes.c_int()
open("x", "w").close()
assert libc.name_to_handle_at(-100, b"x", ctypes.byref(handle), ctypes.byref(mount_id), 0) == 0
return libc.open_by_handle_at(os.open(".", os.O_RDONLY), ctypes.byref(handle), os.O_RDONLY) >= 0"""


def test_open_by_handle_at_needs_a_capability_the_sandbox_lacks():
    if ROOT:  # control: root keeps CAP_DAC_READ_SEARCH without isolation
        assert attempt(OPEN_BY_HANDLE, cfg=UNSAFE).passed
    result = attempt(OPEN_BY_HANDLE)
    assert contained(result), result.output


def test_another_process_environment_is_out_of_sight(victim):
    body = f"return b'AREAL_SECRET=s3cret' in open('/proc/{victim}/environ', 'rb').read()"
    assert attempt(body, cfg=UNSAFE).passed
    assert contained(attempt(body))
    body = "import os\nreturn sorted(int(p) for p in os.listdir('/proc') if p.isdigit())[-1] > 100"
    assert contained(attempt(body))  # the sandbox's /proc lists its own few processes only


def test_signals_reach_nothing_outside(victim):
    assert contained(attempt(f"import os\nos.kill({victim}, 9)\nreturn True"))
    assert contained(attempt(f"import os\nos.kill({os.getpid()}, 9)\nreturn True"))
    assert contained(attempt("import os\nos.kill(os.getppid(), 9)\nos.kill(-1, 9)\nreturn True"))
    os.kill(victim, 0)  # still alive, and so is this test process
    assert attempt(f"import os\nos.kill({victim}, 9)\nreturn True", cfg=UNSAFE).passed  # control


KERNEL_SURFACE = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
return libc.{call} == 0"""


@pytest.mark.parametrize(
    "call", ["unshare(0x10000000)", "ptrace(0, 0, 0, 0)", "syscall(250, 0, 0, 0, 0)"],
    ids=["new_user_namespace", "ptrace", "keyctl"],
)  # fmt: skip
def test_kernel_interfaces_an_escape_starts_from_are_refused(call):
    body = KERNEL_SURFACE.format(call=call)
    assert contained(attempt(body))  # seccomp: EPERM
    if call.startswith("unshare"):
        assert attempt(body, cfg=UNSAFE).passed  # control: allowed without the sandbox


SURVIVOR = """import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/sleep", ["sleep", "31.4159"])
    os._exit(0)
os.wait()
return True"""


def test_nothing_outlives_the_call():
    result, leftovers = left_behind(attempt, SURVIVOR, escaped="never")
    assert contained(result) and leftovers == set()
    before = sandbox_processes()
    attempt(SURVIVOR, cfg=UNSAFE)  # control: without isolation the sleeper survives
    deadline, leftovers = time.monotonic() + 5, set()
    while not leftovers and time.monotonic() < deadline:  # it may not have exec'd sleep yet
        time.sleep(0.05)
        leftovers = sandbox_processes() - before
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert leftovers


def test_no_network_even_to_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    body = (f"import socket\nsocket.create_connection(('127.0.0.1', {server.getsockname()[1]}), "
            "1)\nreturn True")
    try:
        assert contained(attempt(body))
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
        assert attempt(body, cfg=UNSAFE).passed  # control
    finally:
        server.close()


def test_no_unix_sockets_of_the_host(tmp_path):
    abstract, path = f"\0areal-{uuid.uuid4().hex}", str(tmp_path / "sock")
    servers = []
    for address in (abstract, path):
        server = socket.socket(socket.AF_UNIX)
        server.bind(address)
        server.listen(1)
        servers.append(server)
    try:
        for address in (abstract, path):
            body = f"import socket\nsocket.socket(socket.AF_UNIX).connect({address!r})\nreturn True"
            assert contained(attempt(body)), address
            assert attempt(body, cfg=UNSAFE).passed  # control
    finally:
        for server in servers:
            server.close()


def test_writes_land_nowhere_outside_its_private_tmp():
    targets = [Path(f"/var/tmp/areal_escape_{uuid.uuid4().hex}"),
               Path(__file__).with_name(f"areal_escape_{uuid.uuid4().hex}")]  # fmt: skip
    for target in targets:
        assert contained(attempt(f"open({str(target)!r}, 'w').write('x')\nreturn True"))
        assert not target.exists()
    inside = "open('/tmp/scratch', 'w').write('ok')\nreturn open('/tmp/scratch').read()"
    assert attempt(inside, "ok").passed  # its own /tmp works


def test_a_fork_bomb_is_contained_and_the_next_call_works():
    body = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    t0 = time.monotonic()
    result, leftovers = left_behind(attempt, body)
    assert contained(result) and leftovers == set()
    assert time.monotonic() - t0 < FAST.code_wall_s + 5
    assert attempt("return True").passed


ALLOCATE_10GB = """import os, time
for _ in range(25):  # 25 x 400 MiB, each process under its own 512 MiB address-space limit
    try:
        if os.fork() == 0:
            x = b"x" * (400 << 20)
            time.sleep(10)
            os._exit(0)
    except OSError:
        pass
time.sleep(10)
return True"""


def test_10gb_across_many_processes_is_stopped_by_the_whole_tree_limit():
    roomy = RewardConfig(code_cpu_s=5, code_wall_s=8.0, code_mem_mb=512, code_nproc=16)
    result, leftovers = left_behind(attempt, ALLOCATE_10GB, cfg=roomy)  # memory must stop it
    assert contained(result) and leftovers == set()
    assert "MiB across its processes" in result.output, result.output


@pytest.mark.parametrize("body", ["while True:\n    pass", "import time\ntime.sleep(1000)"],
                         ids=["cpu", "sleep"])  # fmt: skip
def test_cpu_and_wall_time_are_bounded(body):
    t0 = time.monotonic()
    result = attempt(body)
    assert contained(result) and time.monotonic() - t0 < FAST.code_wall_s + 5
    assert "[sandbox] killed" in result.output  # by the watchdog, or by SIGXCPU


MEMFD = """import os
held = []
try:
    while len(held) < 96:  # 96 x 16 MiB (each file under RLIMIT_FSIZE): 1.5 GiB
        fd = os.memfd_create("hold")
        os.posix_fallocate(fd, 0, 16 << 20)
        held.append(fd)
except OSError:
    pass
return len(held) * 16 > {limit}"""

FILES_AND_MEMORY = """import os
held = 0
for top in ("/dev/shm", "/dev", "/tmp", "/run", "/var/tmp", "."):
    for n in range(64):  # 16 MiB files (RLIMIT_FSIZE) in every writable place, up to 1 GiB
        try:
            fd = os.open(f"{{top}}/hold{{n}}", os.O_CREAT | os.O_WRONLY, 0o600)
            os.posix_fallocate(fd, 0, 16 << 20)
        except OSError:
            break
        held += 16
resident = bytearray(({limit} - 40) << 20)  # with the interpreter, under the limit by itself
import time
time.sleep(2)
return held + len(resident) // (1 << 20) > {limit}"""


SOCKET_BUFFERS = """import socket
held, pairs, chunk = 0, [], bytes(1 << 20)
try:
    while held < 768 << 20:  # data in flight between socket pairs: kernel memory, 768 MiB
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        a.setblocking(False)
        pairs.append((a, b))
        try:
            while True:
                held += a.send(chunk)
        except BlockingIOError:
            pass
except OSError:
    pass
return held >> 20 > {limit}"""


class ShmemPeak:
    """The highest rise of the host's shared memory (tmpfs, memfd: /proc/meminfo's Shmem), in
    MiB, while the block runs: memory that no process's resident size shows."""

    def __enter__(self):
        self.start, self.peak, self.done = self.shmem(), 0, threading.Event()
        self.thread = threading.Thread(target=self.sample)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()

    def sample(self):
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self.shmem() - self.start)

    @staticmethod
    def shmem() -> int:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("Shmem:"))
        return kib >> 10


@pytest.mark.parametrize("program", ["memfd", "files_and_memory", "socket_buffers"])
def test_memory_held_outside_processes_counts_against_the_limit(program):
    """Memory that no resident size shows (memfd files, tmpfs files, socket buffers) cannot add
    to what the program holds beyond reward.code_mem_mb: refused, or counted and killed at the
    limit."""
    limit = 256
    cfg = RewardConfig(code_cpu_s=5, code_wall_s=8.0, code_mem_mb=limit, code_nproc=16)
    programs = {"memfd": MEMFD, "files_and_memory": FILES_AND_MEMORY,
                "socket_buffers": SOCKET_BUFFERS}
    body = programs[program].format(limit=limit)
    with ShmemPeak() as host:
        result, leftovers = left_behind(attempt, body, cfg=cfg)
    assert contained(result) and leftovers == set(), result.output
    assert host.peak <= limit, f"the host's shared memory rose by {host.peak} MiB"


HARNESS_IN_SIGHT = """import os
found = False
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    found |= len(argv) > 1 and argv[-2].endswith(b"sandbox_harness.py")  # its script, last
return found"""


def test_the_test_harness_is_out_of_the_candidates_sight():
    """The tests run beside the candidate in a sandbox of their own: no process of it, hence no
    memory, file descriptor or stdin of it, is visible from the candidate's."""
    body = HARNESS_IN_SIGHT
    assert attempt(body, cfg=UNSAFE).passed  # control: without isolation it sees the harness
    assert contained(attempt(body))

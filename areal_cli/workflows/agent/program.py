"""workflow.agent_cmd: an agent that is a program, one process per episode, in any language.

Each episode's program runs by ``/bin/sh -c`` in a fresh scratch directory (removed after), its own
process group, with
- ``OPENAI_BASE_URL`` (the episode's ``.../episodes/<key>/v1``), ``OPENAI_API_KEY`` (the worker's
  token), ``ANTHROPIC_BASE_URL`` (the same without ``/v1``) and ``ANTHROPIC_API_KEY``;
- the problem as JSON (``id``, ``prompt``, ``meta``; never the answer) on stdin and in the file
  ``AREAL_PROBLEM_FILE``; with ``agent_reward=file``, ``AREAL_REWARD_FILE`` to write its reward to;
- the episode's clock (``clock.py``: ``workflow.agent_timeout_s`` of its own time, the engine's
  not counted; ``agent_wall_timeout_s`` of wall time) for the program and its verifier together
  (its process group is then killed), and ``workflow.agent_memory_mb`` of address space per
  process (RLIMIT_AS);
- with ``workflow.agent_sandbox``, bubblewrap: a read-only system (``/usr``, the files its command
  names), the scratch directory as its only writable place (``/tmp``, also its home), no
  capabilities, the reward sandbox's seccomp filter with sockets allowed, and a network namespace of
  its own whose only way out is the endpoint: 127.0.0.1 at the endpoint's port is served inside by
  forwarding to the endpoint's Unix socket (``program_shim.py``).

Processes are started with asyncio in the endpoint's loop, which never blocks on them. Their
output is hostile: stdout is dropped, only the last ``TAIL`` bytes of stderr are kept, and a reward
(file or verifier output) is read to at most ``REWARD_BYTES`` and must be a finite number or JSON
with a finite ``reward``. A failure raises ``AgentFailure`` with the exit code and the last lines of
stderr.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import stat
import tempfile
from pathlib import Path

from areal_cli.config.choices import AgentReward
from areal_cli.config.schema import WorkflowConfig
from areal_cli.rewards.sandbox import require, signal_of
from areal_cli.rewards.sandbox_launch import ENV, INSIDE, UID_BASE, bwrap_argv, interpreter
from areal_cli.rewards.sandbox_seccomp import program as seccomp_program
from areal_cli.tasks.base import Problem
from areal_cli.workflows.agent.clock import EpisodeClock
from areal_cli.workflows.agent.episode import EpisodeLog, episode_reward
from areal_cli.workflows.agent.runners import AgentFailure, episode_url

log = logging.getLogger(__name__)
SHIM = Path(__file__).with_name("program_shim.py")
TAIL = 8192  # bytes of a program's stderr kept for the log
TAIL_LINES = 12
REWARD_BYTES = 64 << 10
PROBLEM_FILE, REWARD_FILE = ".areal_problem.json", ".areal_reward"
SYSTEM = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/")  # in every sandbox, read-only
WORD = re.compile(r"(?<!\S)([\w./+-]+)(?!\S)")  # a word of plain path characters, whole


class ProgramAgent:
    def __init__(self, cfg: WorkflowConfig, base: str, token: str, uds: str | None):
        self.cfg, self.base, self.token, self.uds = cfg, base, token, uds
        self.launch_dir = os.getcwd()
        self.cmd, named = resolve_paths(cfg.agent_cmd, self.launch_dir)
        self.verifier, checked = resolve_paths(cfg.agent_verifier_cmd, self.launch_dir)
        self.bwrap = require("bwrap") if cfg.agent_sandbox else None
        self.uid = UID_BASE + os.getpid() if self.bwrap and self.bwrap.own_uid else None
        self.binds: tuple[str, ...] = ()
        if self.bwrap:
            self.binds = ("--ro-bind", str(SHIM), f"{INSIDE}/shim.py",
                          "--bind", uds, f"{INSIDE}/endpoint.sock", *mounts(named + checked))
            self.bpf = seccomp_program(sockets=True)
        self.running: set[asyncio.Task] = set()  # episodes whose program may be alive

    def describe(self) -> str:
        limits = f"memory {self.cfg.agent_memory_mb} MiB" if self.cfg.agent_memory_mb \
            else "no memory limit"
        box = "bubblewrap, the endpoint its only network peer" if self.bwrap else "no sandbox"
        return f"runs {self.cmd!r} per episode; {box}; {limits}; reward: {self.cfg.agent_reward}"

    async def run(self, episode: EpisodeLog, problem: Problem):
        loop = asyncio.get_running_loop()
        clock = episode.clock
        scratch = Path(tempfile.mkdtemp(prefix="areal-agent-"))
        self.running.add(asyncio.current_task())
        try:
            if self.uid is not None:
                os.chown(scratch, self.uid, self.uid)
            public = json.dumps({"id": problem.id, "prompt": problem.prompt,
                                 "meta": problem.meta}, default=str)
            (scratch / PROBLEM_FILE).write_text(public)
            url = episode_url(self.base, episode)
            env = {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": self.token,
                   "ANTHROPIC_BASE_URL": url.removesuffix("/v1"), "ANTHROPIC_API_KEY": self.token,
                   "AREAL_PROBLEM_FILE": self._seen(scratch, PROBLEM_FILE)}
            if self.cfg.agent_reward == AgentReward.file:
                env["AREAL_REWARD_FILE"] = self._seen(scratch, REWARD_FILE)
            code, _, err = await self._spawn(self.cmd, scratch, env, public.encode(), clock)
            if code != 0:
                raise AgentFailure(f"{exited(code)}{stderr_tail(err)}")
            if self.cfg.agent_reward == AgentReward.file:
                return reward_of(read_bounded(scratch / REWARD_FILE), "its reward file")
            if self.cfg.agent_reward == AgentReward.verifier:
                return await self._verify(scratch, problem, episode)
            return None  # the task's reward scores the last reply
        finally:
            self.running.discard(asyncio.current_task())
            await loop.run_in_executor(None, remove, scratch)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop every episode still running: its process group killed, its directory removed."""
        async def stop():
            for task in self.running:
                task.cancel()
            await asyncio.wait(self.running, timeout=10) if self.running else None

        try:
            asyncio.run_coroutine_threadsafe(stop(), loop).result(15)
        except (cf.TimeoutError, RuntimeError) as err:  # a loop already stopping
            log.warning("agent programs: stopping those still running: %r", err)

    async def _verify(self, scratch: Path, problem: Problem, episode: EpisodeLog):
        full = json.dumps(dict(problem.to_dict(), last_reply=episode.last_text), default=str)
        code, out, err = await self._spawn(self.verifier, scratch, {}, full.encode(), episode.clock,
                                           stdout=True)
        if code != 0:
            raise AgentFailure(f"the verifier (workflow.agent_verifier_cmd) {exited(code)}"
                               f"{stderr_tail(err)}")
        if out is None:
            raise AgentFailure(f"the verifier printed more than {REWARD_BYTES} bytes: print the "
                               "reward alone, on its last line")
        lines = out.splitlines()
        return reward_of(lines[-1] if lines else b"", "the verifier's last line")

    def _seen(self, scratch: Path, name: str) -> str:
        """A path of the scratch directory as the program sees it."""
        return f"/tmp/{name}" if self.bwrap else str(scratch / name)

    async def _spawn(self, cmd: str, scratch: Path, env: dict, stdin: bytes, clock: EpisodeClock,
                     stdout: bool = False) -> tuple[int, bytes | None, bytes]:
        """Run ``cmd`` to its end or past the episode's ``clock``: (exit code, stdout — None
        past REWARD_BYTES —, the tail of stderr). Its process group is killed when it ends, so
        nothing of it lives on."""
        spec = {"cmd": cmd, "mem_mb": self.cfg.agent_memory_mb}
        fds: list[int] = []
        if self.bwrap:
            spec.update(uid=self.uid, port=int(self.base.rsplit(":", 1)[1]),
                        socket=f"{INSIDE}/endpoint.sock")
            argv = bwrap_argv(self.bwrap, str(scratch), self.binds)
            # bubblewrap's root (no capability left) may not enter a directory of the sandbox's
            # uid: the shim enters it as that uid
            argv[argv.index("--chdir") + 1] = "/"
            spec["cwd"] = "/tmp"
            if self.bpf is not None:
                read, write = os.pipe()
                os.write(write, self.bpf)  # a filter is a few hundred bytes: within a pipe's buffer
                os.close(write)
                fds.append(read)
                argv[-1:-1] = ["--seccomp", str(read)]
            argv += [interpreter(), "-I", "-S", "-B", f"{INSIDE}/shim.py", json.dumps(spec)]
            env = {**ENV, **env}
        else:
            argv = [interpreter(), "-I", "-S", "-B", str(SHIM), json.dumps(spec)]
            env = {**os.environ, **env}
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE if stdout else asyncio.subprocess.DEVNULL,
                cwd=scratch, env=env, start_new_session=True, pass_fds=fds)
        finally:
            for fd in fds:
                os.close(fd)
        err, out = Tail(TAIL), Capped(REWARD_BYTES)
        readers = [asyncio.ensure_future(feed(proc.stdin, stdin)),
                   asyncio.ensure_future(drain(proc.stderr, err.add))]
        if stdout:
            readers.append(asyncio.ensure_future(drain(proc.stdout, out.add)))
        timed_out = ""
        try:
            await clock.bound(proc.wait())
        except TimeoutError as late:  # not `err`: that is the stderr tail, read below
            timed_out = str(late)
        finally:
            # what it left running, or all of it past the clock or when the worker closes (a
            # sandbox's namespace ends with bubblewrap)
            kill_group(proc.pid)
            await proc.wait()
            # a pipe still held open by something that escaped the group ends the reads here
            _, late = await asyncio.wait(readers, timeout=1.0)
            for task in late:
                task.cancel()
        if timed_out:
            raise AgentFailure(f"{timed_out}: its process group was killed"
                               f"{stderr_tail(err.data)}")
        return proc.returncode, out.data if not out.over else None, err.data


def resolve_paths(cmd: str, launch_dir: str) -> tuple[str, list[str]]:
    """``cmd`` with each word that names a file or directory relative to ``launch_dir`` (and holds
    a "/" or a "."; "." and ".." are left) made absolute, so that the command runs alike from any
    scratch directory; and the paths a sandbox mounts for it: those, and the files (not
    directories) that its absolute words name."""
    named: list[str] = []

    def absolute(m: re.Match) -> str:
        word = m.group(1)
        if word.startswith("/"):
            if os.path.isfile(word):
                named.append(os.path.normpath(word))
            return word
        if word in (".", "..") or word.startswith("-") or not ("/" in word or "." in word):
            return word
        path = os.path.normpath(os.path.join(launch_dir, word))
        if not os.path.exists(path) or not WORD.fullmatch(path):
            return word
        named.append(path)
        return path

    return WORD.sub(absolute, cmd), named


def mounts(paths: list[str]) -> list[str]:
    """bubblewrap's options that show ``paths`` read-only at their own place (their parents made
    searchable: bubblewrap makes those it creates for a bind 0700); the system's are there."""
    out, made = [], set()
    for path in sorted(set(paths)):
        if path.startswith(SYSTEM):
            continue
        for parent in reversed(Path(path).parents[:-1]):
            if parent not in made:
                made.add(parent)
                out += ["--dir", str(parent)]
        out += ["--ro-bind", path, path]
    return out


def reward_of(raw: bytes, source: str):
    """A reward as written by a program: a number, or JSON with "reward" (and numbers to log)."""
    try:
        text = raw.decode("utf-8").strip()
        value = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise AgentFailure(f"{source} holds {raw[:80]!r}, neither a number nor JSON: write a "
                           'number, or JSON such as {"reward": 1.0}') from None
    try:
        episode_reward(value)
    except ValueError:
        raise AgentFailure(f"{source} holds {raw[:80]!r}: write a finite number, or JSON with a "
                           'finite "reward" (and numbers to log)') from None
    return value


def read_bounded(path: Path) -> bytes:
    """At most REWARD_BYTES of the regular file ``path`` (never a link, a FIFO or a device)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise AgentFailure("it wrote no reward file (AREAL_REWARD_FILE)") from None
    except OSError as err:
        raise AgentFailure(f"its reward file cannot be opened: {err.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise AgentFailure("its reward file is not a regular file")
        data = os.read(fd, REWARD_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > REWARD_BYTES:
        raise AgentFailure(f"its reward file is larger than {REWARD_BYTES} bytes")
    return data


class Tail:
    """The last ``limit`` bytes of a stream."""

    def __init__(self, limit: int):
        self.limit, self.data = limit, b""

    def add(self, chunk: bytes) -> None:
        self.data = (self.data + chunk)[-self.limit:]


class Capped:
    """The first ``limit`` bytes of a stream; ``over`` once it passed them (the rest dropped)."""

    def __init__(self, limit: int):
        self.limit, self.data, self.over = limit, b"", False

    def add(self, chunk: bytes) -> None:
        self.over = self.over or len(self.data) + len(chunk) > self.limit
        if not self.over:
            self.data += chunk


async def drain(stream: asyncio.StreamReader, sink) -> None:
    while chunk := await stream.read(1 << 16):
        sink(chunk)


async def feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    """Write ``data`` and close; a program that does not read its stdin is no error."""
    try:
        stream.write(data)
        await stream.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        stream.close()


def exited(code: int) -> str:
    name = signal_of(code)
    return f"was killed by {name}" if name else f"exited with code {code}"


def stderr_tail(data: bytes) -> str:
    """"; its stderr ends:" and its last lines, printable, each cut to 300 characters."""
    text = re.sub(r"[^\S\n]", " ", data.decode("utf-8", errors="replace"))
    text = "".join(c for c in text if c.isprintable() or c == "\n")
    lines = [line[:300] for line in text.splitlines() if line.strip()][-TAIL_LINES:]
    return "; its stderr ends:\n    " + "\n    ".join(lines) if lines else "; no stderr"


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group already ended
        pass


def remove(path: Path) -> None:
    """Remove a scratch directory, whatever modes the program left on its files (what still
    resists is left to the system's tmp cleaner: never the episode's failure)."""
    def unlock(fn, p, _):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            fn(p)

    shutil.rmtree(path, onerror=unlock)

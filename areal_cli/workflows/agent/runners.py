"""How a Python agent's episode runs (a program's: ``program.py``). Each runner's ``run(episode,
problem)`` is awaited in the endpoint's event loop and returns what the agent returned, or raises
(``TimeoutError`` past the episode's clock, ``clock.py``; ``AgentFailure`` for a failure its message
describes in full).

- ``AsyncAgent``: ``async def run(client, problem)``, awaited in the endpoint's loop with an
  ``openai.AsyncOpenAI`` client; the episodes' clients share the worker's connection pools.
- ``ThreadAgent``: a plain ``def run(client, problem)`` (or an async one marked
  ``run.blocking = True``) in a pool of ``workflow.agent_concurrency`` threads, so a blocking call
  never stalls the endpoint's loop. A plain function gets an ``openai.OpenAI`` client on one shared
  synchronous pool; a blocking async one runs in an event loop of its own in its thread with an
  ``openai.AsyncOpenAI`` client. A thread cannot be killed: one whose episode times out is reported
  (its episode fails at once, its later calls are answered 404) and left to end.

A client's calls carry no timeout of their own unless ``workflow.agent_wall_timeout_s`` sets one: a
call waiting in a busy engine is not the agent's time (``clock.py``), and the episode's clock, not
the client, decides when it has run too long.

Either runs the agent with its episode's ``AgentContext`` current (``context.py``), so that a
client it was not handed records into the right episode too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import contextvars
import inspect
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time

from areal_cli.config.schema import WorkflowConfig
from areal_cli.tasks.base import Problem
from areal_cli.workflows.agent.clients import EpisodeClient
from areal_cli.workflows.agent.context import CURRENT, AgentContext
from areal_cli.workflows.agent.episode import EpisodeLog
from areal_cli.workflows.agent.frames import MAX_FRAME, frame, read_frame

log = logging.getLogger(__name__)


class AgentFailure(Exception):
    """An episode's failure that its message describes in full (no traceback to log)."""


def python_agent(fn, base: str, token: str, cfg: WorkflowConfig, *, port: int = 0,
                 processes: int = 0):
    """The runner of ``fn`` (``cfg.agent``): an ``async def`` in ``processes`` agent processes, or
    in the endpoint's loop where that is 0; a ``def`` (or an ``async def`` with
    ``fn.blocking = True``) in threads. ``base``: the endpoint's URL (no ``/v1``), ``port`` its
    port."""
    if inspect.iscoroutinefunction(fn) and not getattr(fn, "blocking", False):
        if processes > 0:
            return ProcessAgent(cfg.agent, processes, port, base, token, cfg)
        return AsyncAgent(fn, base, token, cfg)
    return ThreadAgent(fn, base, token, cfg)


def client_connections(cfg: WorkflowConfig) -> int:
    """Connections the episodes' clients of one worker may hold at once: agent_concurrency, but
    never past 3/4 of workflow.agent_max_connections. The endpoint closes the newest silent
    connection past that limit, and a client that had just opened it for a request failed with a
    ReadError (so did 2 to 19 episodes of an agent run of ~1,150 episodes at once); a quarter is
    left to clients the agents build themselves. Episodes beyond it wait in their pool."""
    return max(1, min(cfg.agent_concurrency, cfg.agent_max_connections * 3 // 4))


def client_timeout(cfg: WorkflowConfig) -> float | None:
    """An episode client's timeout per call: the wall limit where one is set, else none."""
    return cfg.agent_wall_timeout_s or None


def episode_url(base: str, episode: EpisodeLog) -> str:
    """The OpenAI base URL whose calls are recorded into ``episode``."""
    return f"{base}/episodes/{episode.key}/v1"


@contextlib.contextmanager
def running_for(key: str):
    """The agent's code within runs for episode ``key`` (``context.CURRENT``); an error after a call
    of it was refused in this process is that refusal (an ``AgentFailure`` naming the fix)."""
    ctx = AgentContext(key)
    token = CURRENT.set(ctx)
    try:
        yield
    except Exception:
        if ctx.refused:
            raise AgentFailure(ctx.refused) from None
        raise
    finally:
        CURRENT.reset(token)


class AsyncAgent:
    def __init__(self, fn, base: str, token: str, cfg: WorkflowConfig):
        self.fn, self.base, self.token, self.cfg = fn, base, token, cfg
        # the worker's HTTP connection pools, shared by the episodes' clients, made in the
        # endpoint's loop at the first episode: a client of its own per episode would build a TLS
        # context (the system's certificates read and parsed) and open a connection for each call
        self.http: Pools | None = None

    def describe(self) -> str:
        return "async, in the endpoint's event loop"

    async def run(self, episode: EpisodeLog, problem: Problem):
        import openai

        if self.http is None:
            self.http = Pools(client_connections(self.cfg), openai.DefaultAsyncHttpxClient)
        # the shared pools are closed with the workflow, never by an episode's client
        with self.http.lease() as http:
            client = EpisodeClient(base_url=episode_url(self.base, episode), api_key=self.token,
                                   max_retries=0, timeout=client_timeout(self.cfg),
                                   http_client=http)
            with running_for(episode.key):  # the agent's task, made within, inherits it
                return await episode.clock.bound(self.fn(client, problem))

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.http is None:
            return
        for http in self.http.pools:
            try:
                asyncio.run_coroutine_threadsafe(http.aclose(), loop).result(5)
            except (cf.TimeoutError, RuntimeError) as err:  # a loop already stopping
                log.warning("agent endpoint: closing its client pool: %r", err)
                return


class ProcessAgent:
    """An async agent's episodes in ``n`` processes of their own (``agent_process.py``), each
    running its share in an event loop with an ``openai.AsyncOpenAI`` client: the agents' code
    (their client library's work on every call) no longer takes turns with the worker's engine
    loop and endpoint for one GIL. An episode goes to the process running the fewest; its clock
    stays here (time in the engine is measured by the endpoint), and one that times out is
    cancelled there. A process that dies fails its episodes with its exit code, and the next
    episode starts a new one."""

    def __init__(self, spec: str, n: int, port: int, base: str, token: str,
                 cfg: WorkflowConfig):
        self.spec, self.n, self.port, self.base, self.cfg = spec, n, port, base, cfg
        self.connections = max(1, client_connections(cfg) // n)  # each process's pools
        self.procs: list[AgentProcess | None] = [None] * n
        self.lock: asyncio.Lock | None = None

    def describe(self) -> str:
        return f"async, in {self.n} agent process(es) beside the worker"

    async def run(self, episode: EpisodeLog, problem: Problem):
        proc = await self._least_busy()
        fut = proc.submit(episode.key, episode_url(self.base, episode), problem.to_dict())
        try:
            return await episode.clock.bound(fut)
        finally:
            proc.forget(episode.key)

    async def _least_busy(self) -> AgentProcess:
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            for i, p in enumerate(self.procs):
                if p is None or p.dead:
                    self.procs[i] = await AgentProcess.start(self.spec, self.port,
                                                             self.connections, i)
            return min(self.procs, key=lambda p: len(p.pending))

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        for p in self.procs:
            if p is not None:
                p.stop()


class AgentProcess:
    """One process of ``ProcessAgent``: the socket to it, its episodes waiting for an answer."""

    def __init__(self, index: int, popen, reader, writer):
        self.index, self.popen, self.reader, self.writer = index, popen, reader, writer
        self.pending: dict[str, asyncio.Future] = {}
        self.dead = False
        self.listener = asyncio.get_running_loop().create_task(self._listen())

    @classmethod
    async def start(cls, spec: str, port: int, connections: int, index: int) -> AgentProcess:
        ours, theirs = socket.socketpair()
        # it imports what the worker imports (an agent module found on the worker's path)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        with theirs:
            popen = subprocess.Popen(
                [sys.executable, "-m", "areal_cli.workflows.agent.agent_process", spec,
                 str(theirs.fileno()), str(port), str(connections)], pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL, env=env)
        reader, writer = await asyncio.open_connection(sock=ours, limit=MAX_FRAME)
        log.info("agent process %d started (pid %d)", index, popen.pid)
        return cls(index, popen, reader, writer)

    def submit(self, key: str, url: str, problem: dict) -> asyncio.Future:
        """``problem``: ``Problem.to_dict()``."""
        fut = self.pending[key] = asyncio.get_running_loop().create_future()
        self.writer.write(frame({"run": key, "url": url, "problem": problem}))
        return fut

    def forget(self, key: str) -> None:
        """``key`` is over here (answered, timed out, or failed): the process stops its task if it
        still runs."""
        if self.pending.pop(key, None) is not None and not self.dead:
            self.writer.write(frame({"cancel": key}))

    async def _listen(self) -> None:
        try:
            while (msg := await read_frame(self.reader)) is not None:
                # the agent's code runs in that process: a frame is checked like any other input
                key = msg.get("done", msg.get("failed")) if isinstance(msg, dict) else None
                if not isinstance(key, str):
                    raise ValueError(f"a frame that is not an answer: {str(msg)[:80]!r}")
                fut = self.pending.pop(key, None)
                if fut is None or fut.done():
                    continue
                if "done" in msg:
                    fut.set_result(msg.get("result"))
                else:
                    fut.set_exception(AgentFailure(str(msg.get("why", "failed"))))
        except ConnectionResetError:
            pass  # it ended: its exit code says more, below
        except (OSError, ValueError) as err:
            if not self.dead:  # (not the worker stopping it)
                log.error("agent process %d: %s; it is stopped", self.index, err)
                self.popen.kill()
        self.dead = True
        code = await asyncio.get_running_loop().run_in_executor(None, self._reap)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(AgentFailure(
                    f"the agent process running it (pid {self.popen.pid}) exited with code {code} "
                    "(see the worker's log above for what it printed); a new one takes the next "
                    "episodes"))
        self.pending.clear()

    def _reap(self) -> int | None:
        try:
            return self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()

    def stop(self) -> None:
        """End the process (from any thread): SIGTERM, then SIGKILL after 5 s."""
        self.dead = True
        if self.popen.poll() is None:
            self.popen.terminate()
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


class ThreadAgent:
    def __init__(self, fn, base: str, token: str, cfg: WorkflowConfig):
        import openai

        self.fn, self.base, self.token, self.cfg = fn, base, token, cfg
        self.is_async = inspect.iscoroutinefunction(fn)
        n = cfg.agent_concurrency
        self.pool = DaemonPool(n, "agent")
        # httpx.Client is thread-safe: the threads' clients share the worker's pools
        self.http = Pools(min(n, client_connections(cfg)), openai.DefaultHttpxClient)
        self.overrunning = 0  # threads still running an agent whose episode timed out

    def describe(self) -> str:
        kind = "async, marked blocking" if self.is_async else "synchronous"
        return f"{kind}, in a pool of {len(self.pool.threads)} threads"

    async def run(self, episode: EpisodeLog, problem: Problem):
        job = self.pool.submit(self._call, episode.key, episode_url(self.base, episode), problem)
        try:
            return await episode.clock.bound(asyncio.wrap_future(job))
        except TimeoutError as err:
            if job.cancel():  # it waited for a thread all along and never ran
                raise TimeoutError(
                    f"{err}: it waited for a thread of the agent's pool: {self.overrunning} of "
                    f"workflow.agent_concurrency={self.cfg.agent_concurrency} still run agents "
                    "past their episode's timeout") from None
            self.overrunning += 1
            loop, t0 = asyncio.get_running_loop(), time.monotonic()
            job.add_done_callback(
                lambda _: loop.call_soon_threadsafe(self._ended, episode.key, t0))
            raise TimeoutError(f"{err}: its thread cannot be killed and runs on until the agent "
                               f"returns ({self.overrunning} such now)") from None

    def _ended(self, key: str, t0: float) -> None:
        self.overrunning -= 1
        log.warning("agent thread of episode %s ended %.1fs after its episode timed out", key,
                    time.monotonic() - t0)

    def _call(self, key: str, url: str, problem: Problem):
        """The agent's run, in a thread of the pool (in a context of its own: the thread's outlives
        the episode)."""
        return contextvars.Context().run(self._call_in_context, key, url, problem)

    def _call_in_context(self, key: str, url: str, problem: Problem):
        import openai

        with running_for(key):
            if self.is_async:  # the loop's tasks inherit the context
                return asyncio.run(self._call_async(url, problem))
            with self.http.lease() as http:
                client = openai.OpenAI(base_url=url, api_key=self.token, max_retries=0,
                                       timeout=client_timeout(self.cfg), http_client=http)
                return self.fn(client, problem)

    async def _call_async(self, url: str, problem: Problem):
        import openai

        # each episode's own async pool shares the worker's certificates, read once
        async with openai.DefaultAsyncHttpxClient(verify=self.http.ssl) as http:
            client = EpisodeClient(base_url=url, api_key=self.token, max_retries=0,
                                   timeout=client_timeout(self.cfg), http_client=http)
            return await self.fn(client, problem)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        # threads of agents that overran are not waited for: they end with the process
        self.pool.shutdown()
        for http in self.http.pools:
            http.close()


POOL_CONNECTIONS = 16
"""Connections of one HTTP pool of the episodes' clients. httpcore looks through every connection of
a pool for each request it places: with one pool of ~1,000 connections (an agent run's episodes at
once) that search took 41% of the endpoint thread's time (py-spy, 2-core CPU), and the engine waited
for requests. The worker's connections are split among pools of this size instead."""


class Pools:
    """``ceil(n / POOL_CONNECTIONS)`` HTTP connection pools (``make(limits=..., verify=...)``: an
    httpx client, sync or async) sharing one TLS context, holding ``n`` connections in all; an
    episode leases the one fewest episodes use (``lease``, from any thread)."""

    def __init__(self, n: int, make):
        import ssl

        import httpx

        n = max(1, n)
        k = -(-n // POOL_CONNECTIONS)
        size = -(-n // k)
        self.ssl = ssl.create_default_context()  # the system's certificates, read once
        self.pools = [make(limits=httpx.Limits(max_connections=size,
                                               max_keepalive_connections=size),
                           verify=self.ssl) for _ in range(k)]
        self.users = [0] * k
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def lease(self):
        with self.lock:
            i = min(range(len(self.pools)), key=self.users.__getitem__)
            self.users[i] += 1
        try:
            yield self.pools[i]
        finally:
            with self.lock:
                self.users[i] -= 1


class DaemonPool:
    """``n`` daemon threads running submitted calls. Not a ThreadPoolExecutor: that joins its
    threads when the interpreter exits, so one agent stuck in its own code would hold the worker's
    exit forever."""

    def __init__(self, n: int, name: str):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                        for i in range(n)]
        for t in self.threads:
            t.start()

    def submit(self, fn, *args) -> cf.Future:
        fut: cf.Future = cf.Future()
        self.jobs.put((fut, fn, args))
        return fut

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            fut, fn, args = job
            if not fut.set_running_or_notify_cancel():  # cancelled while it waited
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as err:  # noqa: BLE001 — the user's agent: handed to its episode
                fut.set_exception(err)

    def shutdown(self) -> None:
        """Cancel the calls still waiting and stop each thread once its call ends."""
        while True:
            try:
                self.jobs.get_nowait()[0].cancel()
            except queue.Empty:
                break
        for _ in self.threads:
            self.jobs.put(None)

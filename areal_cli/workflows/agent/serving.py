"""How the agent endpoint is served: uvicorn on 127.0.0.1 (or a Unix socket) in a thread with its
own event loop (``Server``), the HTTP protocol's guards against clients that hold connections
without using them (``guarded_protocol``), a request's body, key and disconnection as the routes
read them, and the worker's bearer token (``new_token``). The routes and what they do are
``server.py``'s."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import socket
import threading
import time
from typing import TYPE_CHECKING

from areal_cli.workflows.agent.requests import ApiError

if TYPE_CHECKING:
    from fastapi import Request


def guarded_protocol(refuse, max_connections: int, connected=None, read_s: float = 10.0):
    """uvicorn's HTTP/1.1 protocol with two guards against clients that hold connections without
    using them. Past ``max_connections`` the oldest connection that has sent nothing yet is closed
    to make room (the newcomer where every one has: ``refuse`` counts it as
    agent_refused_connections), so idle connections cannot keep the agents' own out: theirs send
    their request at once. And one that sends nothing before its first request is closed after the
    idle timeout, as uvicorn closes one idle between requests. A request must arrive whole (headers
    and body) within ``read_s`` of its first byte, or its connection is closed (a client trickling
    bytes would hold its slot for ever; counted as agent_slow_requests). ``connected()`` is called
    for each connection accepted."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Guarded(H11Protocol):
        silent_since: float | None = None  # when it connected, until its first byte
        read_deadline = None  # from a request's first byte until it is read whole

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.silent_since = time.monotonic()
            if connected is not None:
                connected()
            if len(self.connections) > max_connections:
                silent = [c for c in self.connections
                          if c is not self and getattr(c, "silent_since", None) is not None]
                victim = min(silent, key=lambda c: c.silent_since) if silent else self
                refuse("agent_refused_connections")
                victim.transport.close()
                if victim is self:
                    return
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler)

        def data_received(self, data: bytes) -> None:
            self.silent_since = None
            if self.read_deadline is None:
                self.read_deadline = self.loop.call_later(read_s, self.read_too_slow)
            super().data_received(data)

        def read_too_slow(self) -> None:
            self.read_deadline = None
            # IDLE: its headers are not complete yet; SEND_BODY: its body is not
            if not self.transport.is_closing() and self.conn.their_state in (h11.IDLE,
                                                                              h11.SEND_BODY):
                refuse("agent_slow_requests")
                self.transport.close()

        def on_response_complete(self) -> None:
            if self.read_deadline is not None:
                self.read_deadline.cancel()
                self.read_deadline = None
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            if self.read_deadline is not None:
                self.read_deadline.cancel()
            super().connection_lost(exc)

    return Guarded


class Server:
    """uvicorn serving ``app`` on 127.0.0.1 (a free port) in a thread with its own event loop, which
    the agents' episodes share (``loop``); ``protocol``: its HTTP protocol class (uvicorn's own by
    default), ``idle_s``: how long a connection may send nothing; ``uds``: a Unix socket path to
    serve on too (a sandboxed program's only way in: the path's directory keeps others out)."""

    # the port of this process's first endpoint: a later one (areal eval's next model or task) is
    # served on it again where it is free, so a client built from the environment still reaches it
    first_port = 0

    def __init__(self, app, protocol=None, idle_s: float = 5.0, uds: str | None = None):
        import uvicorn

        self.sock = bind_loopback(Server.first_port)
        self.port = self.sock.getsockname()[1]
        Server.first_port = Server.first_port or self.port
        self.sockets, self.uds = [self.sock], uds
        if uds is not None:
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unix.bind(uds)
            # any uid may connect (a sandbox's own, as root): the directory decides who reaches it
            os.chmod(uds, 0o666)
            self.sockets.append(unix)
        self.loop = asyncio.new_event_loop()
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                                    access_log=False, http=protocol or "h11",
                                                    timeout_keep_alive=idle_s))
        self.thread = threading.Thread(target=self._serve, name="agent-endpoint", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline and self.thread.is_alive():
            time.sleep(0.01)
        if not self.server.started:
            raise RuntimeError("the agent endpoint did not start within 30 s (see the log above)")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve(sockets=self.sockets))

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        for sock in self.sockets:
            sock.close()


DISCONNECTED = object()


async def until_disconnected(request: Request, work):
    """``work``'s result, or ``DISCONNECTED`` once the client has gone away (``work`` is then
    cancelled, and so its requests in the engine). The request's body is read by then: the server's
    next message for it is the disconnection, awaited once (polling ``is_disconnected`` four times a
    second for each of ~1,000 open calls took 15% of the endpoint thread)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnection(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, ApiError):
        await task
    return DISCONNECTED


async def _disconnection(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def read_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None as soon as it is known to pass ``limit`` bytes: from its
    Content-Length, else while it streams in (what was read is dropped)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def bearer(headers) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header (None without one)."""
    value = headers.get("authorization") or ""
    return value[7:] if value[:7].lower() == "bearer " else None


def api_key(headers) -> str | None:
    """Anthropic's clients: ``x-api-key: <key>``, else a bearer token."""
    return headers.get("x-api-key") or bearer(headers)



def bind_loopback(port: int) -> socket.socket:
    """A TCP socket bound to 127.0.0.1 at ``port`` where it is free, else at a free port."""
    # IPPROTO_TCP named: asyncio then turns Nagle off on each accepted connection (it skips a socket
    # made with proto 0), else a response written in two parts waits for the client's delayed ACK
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:  # taken: by another endpoint of this process, or another program
        sock.bind(("127.0.0.1", 0))
    return sock


@functools.cache
def new_token() -> str:
    """The bearer token of this process's endpoints: one for the process, so that a client built
    from the environment keeps working when one endpoint follows another (as the port does)."""
    return secrets.token_urlsafe(32)

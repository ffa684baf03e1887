"""The episode a Python agent's code runs for, carried to the endpoint by the calls it makes, so
that a client the agent was not handed records into the right episode.

An agent may call through a process-wide client instead of the one it is handed: the ``openai``
module's own (``openai.base_url = ...``), a module-level ``AsyncOpenAI()`` built from the
environment, a framework's ``set_default_openai_client(client)``. Such a client is shared by every
episode of the worker, and its URL names whichever episode set it last (or the worker's plain
``/v1``). So each episode's run holds an ``AgentContext`` in a context variable (``CURRENT``, set by
``runners.py``): the asyncio tasks the agent creates inherit it, and so do threads it starts with
``asyncio.to_thread`` or ``contextvars.copy_context().run``. Every httpx / httpx2 request that code
makes to an endpoint of this process carries the episode's key in the ``HEADER`` header, and the
endpoint records the call into that episode whatever the URL says (``server.py``). Requests to
anywhere else are not touched; one made outside every episode's context goes where its URL says.

A synchronous client's request to the endpoint from the endpoint's own event loop (an async agent
calling ``openai.chat.completions.create``) would block the loop that serves it until the episode's
timeout: it is refused at once, and its episode fails with the cause and the fix.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import logging
import os
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

HEADER = "x-areal-episode"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
CLIENT_LIBRARIES = ("httpx", "httpx2")  # openai's and anthropic's clients send through either
SYNC_IN_LOOP = (
    "a synchronous client (such as the openai module's own, openai.chat.completions.create) called "
    "the endpoint from an async agent, in the endpoint's event loop, which it would block until "
    "workflow.agent_timeout_s: call through an async client (the one the agent is handed, or "
    "openai.AsyncOpenAI()), or make the agent a plain def (or mark it run.blocking = True) so it "
    "runs in a thread")


@dataclass
class AgentContext:
    """What an episode's code carries: its key, and why a call of it was refused before it left the
    agent's process ("" while none was)."""

    key: str
    refused: str = ""


CURRENT: contextvars.ContextVar[AgentContext | None] = contextvars.ContextVar(
    "areal_agent_episode", default=None)
_ENDPOINTS: dict[int, int] = {}  # port of each endpoint of this process → its event loop's thread
_PATCHED: set[str] = set()
_LOCK = threading.Lock()


def register_endpoint(port: int, loop_thread: int) -> None:
    """Tag the calls to the endpoint on ``port`` (loopback) from now on; ``loop_thread``: the ident
    of the thread of its event loop."""
    with _LOCK:
        for name in CLIENT_LIBRARIES:
            if name not in _PATCHED:
                _patch(name)
        _ENDPOINTS[port] = loop_thread


def unregister_endpoint(port: int, loop_thread: int) -> None:
    """Stop tagging the calls to the endpoint ``register_endpoint`` named (not to a later one on
    the same port)."""
    with _LOCK:
        if _ENDPOINTS.get(port) == loop_thread:
            del _ENDPOINTS[port]


def tag(request, blocking: bool) -> None:
    """Before ``request`` (an httpx / httpx2 ``Request``) is sent: the episode's header on a call to
    an endpoint of this process, or a refusal of a blocking call from the endpoint's loop."""
    url = request.url
    loop_thread = _ENDPOINTS.get(url.port) if url.host in LOOPBACK else None
    if loop_thread is None:
        return
    ctx = CURRENT.get()
    if blocking and threading.get_ident() == loop_thread:
        if ctx is not None:
            ctx.refused = SYNC_IN_LOOP
        raise RuntimeError(SYNC_IN_LOOP)
    if ctx is not None:
        request.headers[HEADER] = ctx.key


def _patch(name: str) -> None:
    """Wrap ``Client.send`` and ``AsyncClient.send`` of the client library ``name`` (every request
    of every client of it passes there, whatever its transport), where it is installed."""
    _PATCHED.add(name)
    try:
        lib = importlib.import_module(name)
    except ImportError:
        return
    send, send_async = lib.Client.send, lib.AsyncClient.send

    @functools.wraps(send)
    def tagged(self, request, *args, **kwargs):
        tag(request, blocking=True)
        return send(self, request, *args, **kwargs)

    @functools.wraps(send_async)
    async def tagged_async(self, request, *args, **kwargs):
        tag(request, blocking=False)
        return await send_async(self, request, *args, **kwargs)

    lib.Client.send, lib.AsyncClient.send = tagged, tagged_async


def environment(base: str, token: str) -> dict[str, str]:
    """What points a client built from the environment (``openai.AsyncOpenAI()``,
    ``anthropic.AsyncAnthropic()``) at the endpoint served at ``base`` (no ``/v1``)."""
    return {"OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_KEY": token,
            "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": token}


def export_environment(base: str, token: str) -> None:
    """``environment(base, token)`` into this process's environment, for the rest of its life."""
    values = environment(base, token)
    replaced = sorted(k for k, v in values.items() if os.environ.get(k, v) != v)
    os.environ.update(values)
    if replaced:
        log.info("agent endpoint: %s of the worker's environment now name the endpoint (a client "
                 "built from the environment calls the policy)", ", ".join(replaced))


@contextlib.contextmanager
def placeholder_environment():
    """Within, the environment a worker gives its agent, naming no endpoint that serves: importing
    an agent outside a worker (the launcher's checks) builds its module-level clients as a worker
    does, and calls none."""
    values = environment("http://127.0.0.1:9", "not-a-worker")
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

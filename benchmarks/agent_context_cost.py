"""What it costs to record the calls of a client an agent was not handed into the right episode
(``areal_cli/workflows/agent/context.py``), against the alternative of one process per episode.

Prints, on this machine:
- the work added to each request by the tag (a context-variable read, a port lookup, a header),
  for a request to the endpoint and for one elsewhere;
- a real HTTP round trip on loopback (uvicorn serving a route, ``httpx2.AsyncClient`` as the openai
  client uses) without and with the tag, one call at a time and 16 at once;
- a fresh Python process that imports the clients and builds one (what one process per episode
  would pay at every episode before its first call).

    python benchmarks/agent_context_cost.py [calls]
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
import timeit

import httpx2
from fastapi import FastAPI

from areal_cli.workflows.agent import context
from areal_cli.workflows.agent.serving import Server


def tag_cost(port: int, n: int = 200_000) -> tuple[float, float]:
    """Microseconds per ``context.tag`` of a request to the endpoint, and to elsewhere."""
    to_endpoint = httpx2.Request("POST", f"http://127.0.0.1:{port}/v1/chat/completions")
    elsewhere = httpx2.Request("POST", "http://10.0.0.1:8000/v1/chat/completions")
    token = context.CURRENT.set(context.AgentContext("0-0-secret"))
    try:
        t_in = timeit.timeit(lambda: context.tag(to_endpoint, False), number=n) / n
        t_out = timeit.timeit(lambda: context.tag(elsewhere, False), number=n) / n
    finally:
        context.CURRENT.reset(token)
    return t_in * 1e6, t_out * 1e6


async def round_trips(url: str, calls: int, at_once: int) -> float:
    """Median microseconds per call, ``at_once`` calls in flight."""
    async with httpx2.AsyncClient() as client:
        await client.get(url)  # the connection opened
        times = []
        for _ in range(calls // at_once):
            t0 = time.perf_counter()
            await asyncio.gather(*(client.get(url) for _ in range(at_once)))
            times.append((time.perf_counter() - t0) / at_once)
    return statistics.median(times) * 1e6


def process_start(n: int = 5) -> float:
    """Median seconds for a Python process to import the openai and anthropic clients and build
    one."""
    code = ("import openai, anthropic; "
            "openai.AsyncOpenAI(base_url='http://127.0.0.1:9/v1', api_key='k')")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": []}

    server = Server(app)
    url = f"{server.url}/v1/models"
    try:
        t_in, t_out = tag_cost(server.port)
        print(f"tag per request: {t_in:.2f} us to the endpoint, {t_out:.2f} us elsewhere "
              "(not registered: as before any agent)")
        before = {k: asyncio.run(round_trips(url, calls, k)) for k in (1, 16)}
        context.register_endpoint(server.port, server.thread.ident)

        async def tagged(k):
            context.CURRENT.set(context.AgentContext("0-0-secret"))
            return await round_trips(url, calls, k)

        after = {k: asyncio.run(tagged(k)) for k in (1, 16)}
        for k in (1, 16):
            print(f"loopback round trip, {k:2d} at once: {before[k]:7.1f} us untagged, "
                  f"{after[k]:7.1f} us tagged ({after[k] - before[k]:+.1f} us)")
    finally:
        context.unregister_endpoint(server.port, server.thread.ident)
        server.close()
    print(f"a fresh process importing the clients and building one: {process_start():.2f} s "
          "(per episode, with one process per episode)")


if __name__ == "__main__":
    main()

"""What it costs to record the calls of a client an agent was not handed into the right episode
(``areal_cli/workflows/agent/context.py``), against the alternative of one process per episode.

Prints, on this machine:
- the work added to each request by the tag (a context-variable read, a port lookup, a header),
  for a request to the endpoint and for one elsewhere;
- a real HTTP round trip on loopback (uvicorn serving a route in a thread, as the worker serves its
  endpoint; ``httpx2.AsyncClient`` as the openai client uses) without and with the tag, one call at
  a time and 16 at once;
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

from areal_cli.runtime import short_gil_switch
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


async def round_trips(url: str, calls: int, at_once: int) -> tuple[float, float]:
    """Median microseconds per call, ``at_once`` calls in flight: outside every episode's context
    (sent as before), and within one (tagged); batches of the two alternate, so that drift in a
    shared machine's speed falls on both."""
    async with httpx2.AsyncClient() as client:
        await client.get(url)  # the connection opened

        async def batch() -> float:
            t0 = time.perf_counter()
            await asyncio.gather(*(client.get(url) for _ in range(at_once)))
            return (time.perf_counter() - t0) / at_once

        async def tagged() -> float:
            context.CURRENT.set(context.AgentContext("0-0-secret"))  # this task's alone
            return await batch()

        plain, tag = [], []
        for _ in range(calls // at_once // 2):
            plain.append(await batch())
            tag.append(await asyncio.create_task(tagged()))
    return statistics.median(plain) * 1e6, statistics.median(tag) * 1e6


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

    short_gil_switch()  # as the rollout worker serving the endpoint does
    server = Server(app)
    url = f"{server.url}/v1/models"
    try:
        t_in, t_out = tag_cost(server.port)
        print(f"tag per request: {t_in:.2f} us to the endpoint, {t_out:.2f} us elsewhere "
              "(not registered: as before any agent)")
        context.register_endpoint(server.port, server.thread.ident)
        for k in (1, 16):
            plain, tagged = asyncio.run(round_trips(url, calls, k))
            print(f"loopback round trip, {k:2d} at once: {plain:7.1f} us untagged, "
                  f"{tagged:7.1f} us tagged ({tagged - plain:+.1f} us)")
    finally:
        context.unregister_endpoint(server.port, server.thread.ident)
        server.close()
    print(f"a fresh process importing the clients and building one: {process_start():.2f} s "
          "(per episode, with one process per episode)")


if __name__ == "__main__":
    main()

"""A process that runs async agents' episodes for a rollout worker (``runners.ProcessAgent``), so
that the agents' own code (their client library's request building, HTTP and response parsing:
more than half of the endpoint thread's time with the ``openai`` client, py-spy on a 2-core CPU)
runs beside the worker instead of taking turns with it for one GIL.

    python -m areal_cli.workflows.agent.agent_process SPEC FD PORT CONNECTIONS

SPEC: ``workflow.agent``; FD: this end of a socket pair with the worker; PORT: the endpoint's (its
key in ``OPENAI_API_KEY``, which the worker exported); CONNECTIONS: its clients' share of the
worker's (``runners.client_connections``). Frames both ways are a
4-byte big-endian length and a JSON object:

- worker → process: ``{"run": key, "url": base_url, "problem": Problem.to_dict()}``,
  ``{"cancel": key}``;
- process → worker: ``{"done": key, "result": what the agent returned}`` or ``{"failed": key,
  "why": text}`` (the agent raised, or returned what JSON cannot carry).

The process ends when the socket closes. Each episode runs with its ``AgentContext`` current and
this process's calls to the endpoint tagged (``context.py``), as in the worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
import traceback

from areal_cli.tasks.base import Problem
from areal_cli.workflows.agent.clients import EpisodeClient
from areal_cli.workflows.agent.context import register_endpoint
from areal_cli.workflows.agent.episode import import_agent
from areal_cli.workflows.agent.frames import MAX_FRAME, frame, read_frame
from areal_cli.workflows.agent.runners import Pools, running_for


class Runner:
    def __init__(self, fn, token: str, connections: int, writer: asyncio.StreamWriter):
        import openai

        self.fn, self.token, self.writer = fn, token, writer
        self.http = Pools(connections, openai.DefaultAsyncHttpxClient)
        self.tasks: dict[str, asyncio.Task] = {}

    def start(self, key: str, url: str, problem: dict) -> None:
        self.tasks[key] = asyncio.get_running_loop().create_task(
            self.episode(key, url, Problem.from_dict(problem)))

    def cancel(self, key: str) -> None:
        task = self.tasks.pop(key, None)
        if task is not None:
            task.cancel()

    async def episode(self, key: str, url: str, problem: Problem) -> None:
        try:
            with self.http.lease() as http:
                client = EpisodeClient(base_url=url, api_key=self.token, max_retries=0,
                                       timeout=None, http_client=http)
                with running_for(key):
                    result = await self.fn(client, problem)
            out = {"done": key, "result": result}
            body = frame(out)
        except asyncio.CancelledError:
            return  # the worker gave up on the episode (its clock): nothing to say
        except TypeError as err:  # json: what the agent returned cannot be carried
            body = frame({"failed": key, "why": f"the agent returned what JSON cannot carry: {err}"
                          ": return a float, a dict with 'reward' (and numbers to log), or None"})
        except BaseException as err:  # noqa: BLE001 — the user's agent: handed to its episode
            body = frame({"failed": key,
                          "why": "".join(traceback.format_exception(err)).rstrip()})
        finally:
            self.tasks.pop(key, None)
        self.writer.write(body)


async def serve(spec: str, fd: int, port: int, connections: int) -> None:
    fn = import_agent(spec)
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_connection(sock=sock, limit=MAX_FRAME)
    # a client the agent was not handed (built from OPENAI_BASE_URL, which the worker exported)
    # carries the episode of the code that calls it, as in the worker
    register_endpoint(port, threading.get_ident())
    runner = Runner(fn, os.environ["OPENAI_API_KEY"], connections, writer)
    while (msg := await read_frame(reader)) is not None:
        if "run" in msg:
            runner.start(msg["run"], msg["url"], msg["problem"])
        elif "cancel" in msg:
            runner.cancel(msg["cancel"])
        await writer.drain()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker ends it (its socket closes)
    spec, fd, port, connections = sys.argv[1], *map(int, sys.argv[2:5])
    asyncio.run(serve(spec, fd, port, connections))


if __name__ == "__main__":
    main()

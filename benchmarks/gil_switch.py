"""What Python's GIL switch interval does to an OpenAI-compatible endpoint served from a thread
while the process's main thread is busy (as a rollout worker's engine loop is): N clients of the
real ``openai`` package make calls against a FastAPI app under uvicorn, in the thread's event loop,
while the main thread runs Python; prints calls/s and the median latency per switch interval.

    python benchmarks/gil_switch.py [--intervals 0.005 0.0005] [--clients 32] [--calls 10]

Each interval runs in a fresh process (the interval is process-wide). The numbers are of this
machine and of how busy it is: compare rows of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time


def app():
    from fastapi import FastAPI

    api = FastAPI()

    @api.post("/v1/chat/completions")
    async def chat(body: dict):
        return {"id": "c", "object": "chat.completion", "created": 0,
                "model": body.get("model", "m"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "4"}}]}

    return api


def one(interval: float, clients: int, calls: int, busy: bool) -> dict:
    import openai
    import uvicorn

    sys.setswitchinterval(interval)
    loop = asyncio.new_event_loop()
    server = uvicorn.Server(uvicorn.Config(app(), host="127.0.0.1", port=0, log_level="warning",
                                           loop="asyncio"))
    threading.Thread(target=lambda: (asyncio.set_event_loop(loop),
                                     loop.run_until_complete(server.serve())),
                     daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    stop = threading.Event()

    def spin():  # the engine loop's Python work, in the main thread's stead
        while not stop.is_set():
            sum(range(1000))

    if busy:
        threading.Thread(target=spin, daemon=True).start()

    async def run():
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k",
                                    max_retries=0)
        latency = []

        async def agent():
            for _ in range(calls):
                t = time.perf_counter()
                await client.chat.completions.create(model="m",
                                                     messages=[{"role": "user", "content": "2+2?"}])
                latency.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*[agent() for _ in range(clients)])
        return time.perf_counter() - t0, latency

    wall, latency = asyncio.run_coroutine_threadsafe(run(), loop).result()
    stop.set()
    return {"interval_s": interval, "busy_main_thread": busy, "calls_per_s": clients * calls / wall,
            "latency_ms_median": 1e3 * statistics.median(latency)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--intervals", type=float, nargs="+", default=[0.005, 0.0005])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--one", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--idle", action="store_true", help="no busy main thread (the baseline)")
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.clients, args.calls, not args.idle)), flush=True)
        return
    for interval in args.intervals:
        for idle in (True, False):
            cmd = [sys.executable, __file__, "--one", str(interval), "--clients", str(args.clients),
                   "--calls", str(args.calls)] + (["--idle"] if idle else [])
            got = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            print(f"switch interval {interval * 1e3:.1f} ms, main thread "
                  f"{'busy' if not idle else 'idle'}: {got['calls_per_s']:.0f} calls/s, median "
                  f"latency {got['latency_ms_median']:.0f} ms", flush=True)


if __name__ == "__main__":
    main()

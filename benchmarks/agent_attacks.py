"""A live workflow=agent run attacked from loopback while it trains: idle connections past the cap,
oversized and over-deep bodies, token ids past the vocabulary, a 3 MB message, clients that
disconnect, requests trickled in a byte at a time, writes into episodes by guessed keys, and a flood
of calls outside any episode, all at once, bounded in count and time. Prints the run's outcome and
what the endpoint refused (from metrics.jsonl); exits 1 if the run did not finish every step.

    python benchmarks/agent_attacks.py [steps] [seconds]
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CAP = 64  # workflow.agent_max_connections of the run: the idle attack opens more


def attacks(base: str, key: str, until: float, tally: Counter) -> list[threading.Thread]:
    """One thread per attack, each repeating until ``until``; ``tally``: status codes seen."""
    auth = {"authorization": f"Bearer {key}"}
    chat = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}

    def post(name, path, **kw):
        try:
            r = httpx.post(f"{base}{path}", headers=auth, timeout=kw.pop("timeout", 30), **kw)
            tally[f"{name} {r.status_code}"] += 1
        except httpx.HTTPError as err:
            tally[f"{name} {type(err).__name__}"] += 1

    def repeat(name, fn, pause):
        def loop():
            while time.monotonic() < until:
                fn(name)
                time.sleep(pause)
        return threading.Thread(target=loop, name=name, daemon=True)

    def idle(name):
        host, port = base.split("//")[1].split("/")[0].split(":")
        socks = []
        for _ in range(CAP + 16):
            try:
                socks.append(socket.create_connection((host, int(port)), timeout=5))
            except OSError:
                tally[f"{name} refused_by_os"] += 1
        time.sleep(3)
        closed = 0
        for s in socks:
            s.settimeout(0.01)
            try:
                closed += s.recv(1) == b""
            except OSError:
                pass
            s.close()
        tally[f"{name} closed_by_server"] += closed

    def trickle(name):
        host, port = base.split("//")[1].split("/")[0].split(":")
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}"
                "\r\nContent-Length: 1000\r\n\r\n").encode()
        try:
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(head)
                for _ in range(20):  # one byte a second: the request never arrives whole
                    s.sendall(b" ")
                    time.sleep(1.0)
                tally[f"{name} still_open"] += 1
        except OSError:
            tally[f"{name} closed_by_server"] += 1

    one = "/v1/chat/completions"
    return [
        repeat("trickle", trickle, 0.5),
        repeat("idle_connections", idle, 1.0),
        repeat("large_body", lambda n: post(n, one, content=b" " * (5 << 20)), 2.0),
        repeat("deep_json", lambda n: post(n, one, content=b"[" * 50_000 + b"]" * 50_000), 1.0),
        repeat("vocab", lambda n: post(n, "/v1/completions",
                                       json={"model": "m", "prompt": [1, 10 ** 6]}), 1.0),
        repeat("huge_message", lambda n: post(n, one, json={
            **chat, "messages": [{"role": "user", "content": "word " * 600_000}]}), 2.0),
        repeat("disconnecting", lambda n: post(n, one, json={**chat, "n": 4}, timeout=0.05), 0.2),
        repeat("guessed_episode", lambda n: post(n, "/episodes/0-0/v1/chat/completions",
                                                 json=chat), 0.5),
        repeat("unattributed_flood", lambda n: post(n, one, json={**chat, "n": 16}), 0.0),
    ]


def main(steps: int = 8, seconds: float = 60.0) -> int:
    run = Path(tempfile.mkdtemp(prefix="areal-attacks-")) / "run"
    cmd = [sys.executable, "-m", "areal_cli.cli", "train", "--quiet", f"run_dir={run}",
           "workflow=agent", "workflow.agent=examples.agents.plan_then_answer:run",
           "workflow.max_turns=2", f"workflow.agent_max_connections={CAP}",
           "workflow.agent_idle_timeout_s=2", f"trainer.steps={steps}", "trainer.batch_size=2",
           "rollout.group_size=2", "rollout.max_new_tokens=32", "eval.at_end=false"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    endpoint = run / "agent-0.json"
    while not endpoint.exists() and proc.poll() is None:
        time.sleep(0.5)
    if proc.poll() is not None:
        print(proc.stdout.read())
        return 1
    info = json.loads(endpoint.read_text())
    base = info["base_url"].removesuffix("/v1")
    tally: Counter = Counter()
    threads = attacks(base, info["api_key"], time.monotonic() + seconds, tally)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out, _ = proc.communicate()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    refused = Counter()
    for r in rows:
        for k, v in r.items():
            if k.startswith("agent_") and isinstance(v, (int, float)) and k != "agent_episodes":
                refused[k] += v
    print(json.dumps({"returncode": proc.returncode, "steps": len(rows), "wanted": steps,
                      "wall_s": round(time.monotonic() - t0, 1), "attacked_s": seconds,
                      "attacks": dict(sorted(tally.items())),
                      "endpoint_counts": dict(sorted(refused.items())),
                      "run_dir": str(run)}, indent=1))
    if proc.returncode != 0 or len(rows) != steps:
        print(out[-3000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*(float(a) if i else int(a) for i, a in enumerate(sys.argv[1:]))))

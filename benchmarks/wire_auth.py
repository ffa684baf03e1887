"""What authentication costs on the wire: rollout frames per second through one PUSH/PULL pair.

    python3 benchmarks/wire_auth.py [--seconds 5] [--tokens 64 1024] [--group 4 8]

Two processes on loopback, as a rollout worker and the controller are: the sender pushes one
pre-encoded ``GroupResult`` frame after another, the receiver pulls for ``--seconds``.

* ``plain``: ZeroMQ without security (what areal did before; the NULL mechanism);
* ``curve``: the same sockets with the run's CURVE keys and the controller's ZAP gatekeeper;
* ``channel``: areal's ``Channel`` on both sides (CURVE, ``ZMQ_MAXMSGSIZE``, and the receiver
  decoding and validating every frame), i.e. what the controller's result loop can take.

A frame is one group: ``--group`` samples of a 100-token prompt and ``--tokens`` generated
tokens. Prints one JSON object; frames/s and MiB/s per case.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import tempfile
import time

import numpy as np
import zmq

from areal_cli.transport.auth import Gatekeeper, curve_client, curve_server, load_keys, make_keys
from areal_cli.transport.channels import Channel, free_ports
from areal_cli.transport.messages import GroupResult, Sample, encode


def group(tokens: int, size: int) -> GroupResult:
    rng = np.random.default_rng(0)
    samples = [Sample(i, rng.integers(0, 49152, 100, dtype=np.int32),
                      rng.integers(0, 49152, tokens, dtype=np.int32),
                      rng.normal(-1, 1, tokens).astype(np.float32), np.zeros(tokens, np.int32),
                      np.ones(tokens, np.uint8), 1.0, "ok", "stop", 1, "x" * (4 * tokens))
               for i in range(size)]
    return GroupResult(0, "p", 0, samples, 1.0, tokens * size)


def _send(case: str, addr: str, run_dir: str, frame: bytes, stop) -> None:
    keys = load_keys(run_dir)
    if case == "channel":
        ch = Channel(zmq.PUSH, addr, bind=False, name="results", keys=keys, max_frame=1 << 30,
                     hwm=1000)
        sock = ch.sock
    else:
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, 1000)
        if case == "curve":
            curve_client(sock, keys)
        sock.connect(addr)
    while not stop.is_set():
        try:
            sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            sock.poll(100, zmq.POLLOUT)
    sock.close(0)


def measure(case: str, frame: bytes, seconds: float, run_dir: str) -> dict:
    keys = load_keys(run_dir)
    addr = f"tcp://127.0.0.1:{free_ports('127.0.0.1', 1)[0]}"
    gate = Gatekeeper(keys, logging.getLogger("bench")) if case != "plain" else None
    if case == "channel":
        ch = Channel(zmq.PULL, addr, bind=True, name="results", keys=keys, max_frame=1 << 30,
                     gate=gate)
        recv = lambda: ch.recv(1.0) is not None  # noqa: E731
        sock = ch.sock
    else:
        sock = zmq.Context.instance().socket(zmq.PULL)
        if case == "curve":
            curve_server(sock, keys)
        sock.bind(addr)
        recv = lambda: sock.poll(1000) and sock.recv(copy=False) is not None  # noqa: E731
    stop = mp.Event()
    proc = mp.get_context("fork").Process(target=_send, args=(case, addr, run_dir, frame, stop))
    proc.start()
    assert recv(), f"{case}: no frame arrived"
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += bool(recv())
    dt = time.perf_counter() - t0
    stop.set()
    proc.join(10)
    sock.close(0)
    if gate is not None:
        gate.stop()
    return {"frames_per_s": round(n / dt, 1), "MiB_per_s": round(n * len(frame) / dt / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--group", type=int, nargs="+", default=[4, 8])
    args = ap.parse_args()
    out = []
    with tempfile.TemporaryDirectory() as run_dir:
        make_keys(run_dir)
        for tokens, size in zip(args.tokens, args.group, strict=True):
            frame = encode(group(tokens, size))
            row = {"tokens": tokens, "group": size, "frame_bytes": len(frame)}
            for case in ("plain", "curve", "channel"):
                row[case] = measure(case, frame, args.seconds, run_dir)
            ratio = row["curve"]["frames_per_s"] / row["plain"]["frames_per_s"]
            row["curve_vs_plain"] = round(ratio, 3)
            out.append(row)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

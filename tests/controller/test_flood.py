"""A flood of unauthenticated connections against a live run's controller (loopback only): the
refusals are counted but logged at most once a minute per source, idle connections are dropped
within seconds, and training goes on.

Before: every refused handshake wrote a WARNING (1,777 connections in 10 s added 229 KB to
controller.log) and idle connections held a controller descriptor each for ZeroMQ's 30 s
handshake timeout; the line named the channel ``tcp://127.0.0.1:0``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest
from conftest import AREAL, ROOT, TINY_RUN

from areal_cli.transport.auth import HANDSHAKE_S

CONNECTIONS, SECONDS = 2000, 10.0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _flood(ports: list[int], controller: int) -> tuple[int, list[socket.socket]]:
    """CONNECTIONS connections spread evenly over SECONDS, round-robin over ``ports``: a third left
    idle (held open, returned), a third sending a wrong greeting, a third closed at once.
    Returns the controller's largest descriptor count seen meanwhile, and the idle sockets."""
    held, peak, start = [], 0, time.monotonic()
    for i in range(CONNECTIONS):
        time.sleep(max(0.0, start + i * SECONDS / CONNECTIONS - time.monotonic()))
        try:
            s = socket.create_connection(("127.0.0.1", ports[i % len(ports)]), timeout=2)
        except OSError:
            continue
        if i % 3 == 0:
            held.append(s)
        else:
            if i % 3 == 1:
                # ZMTP 3.0, no CURVE
                s.sendall(b"\xff" + b"\0" * 8 + b"\x7f\x03\x00NULL" + b"\0" * 16)
            s.close()
        if i % 50 == 0:
            peak = max(peak, _fds(controller))
    return peak, held


@pytest.mark.slow  # a whole run (30-60 s on 2 cores): `make test-slow`, which CI runs too
def test_a_connection_flood_adds_few_log_lines_and_no_lasting_descriptors(tiny_model, tmp_path):
    run = tmp_path / "run"
    cmd = AREAL + ["train", "--quiet", f"run_dir={run}", f"model={tiny_model}", *TINY_RUN,
                   "trainer.steps=400",
                   "eval.at_end=false"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 300
        while not (run / "metrics.jsonl").exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no step within 300 s"
            time.sleep(0.5)
        controller = json.loads((run / "pids.json").read_text())["controller"]
        ep = json.loads((run / "endpoints.json").read_text())
        ports = [int(ep[c].rsplit(":", 1)[1])
                 for c in ("work", "results", "batches", "control", "status")]
        log = run / "logs" / "controller.log"
        lines, fds, steps = len(log.read_text().splitlines()), _fds(controller), _steps(run)
        peak, held = _flood(ports, controller)
        time.sleep(HANDSHAKE_S + 1.0)  # the last idle connections' handshake time runs out
        after = _fds(controller)  # the attacker still holds its idle connections open
        for s in held:
            s.close()
        text = log.read_text()
        # the lines the flood added: every line but the run's own progress (INFO)
        added = [x for x in text.splitlines()[lines:] if " INFO " not in x]
        refusals = [x for x in added if "refused a connection" in x]
        print(f"flood: {CONNECTIONS} connections in {SECONDS:.0f} s; controller fds {fds} -> peak "
              f"{peak} -> {after}; {len(added)} log lines added")
        assert len(added) <= 10, "\n".join(added)
        assert refusals and all(f"127.0.0.1:{p}" in " ".join(refusals) for p in ports), refusals
        assert "127.0.0.1:0)" not in text
        assert after - fds <= 100, (fds, peak, after)
        wait = time.monotonic() + 120
        while _steps(run) <= steps and time.monotonic() < wait:  # training went on
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.5)
        assert _steps(run) > steps
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _steps(run) -> int:
    return (run / "metrics.jsonl").read_text().count("\n")

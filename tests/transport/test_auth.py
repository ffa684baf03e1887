"""CURVE on every socket: a peer without the run's keys can neither deliver nor receive a frame,
and every refused connection is logged. Real sockets on loopback."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time

import numpy as np
import pytest
import zmq

from areal_cli.transport.auth import load_keys, make_keys
from areal_cli.transport.channels import Channel, free_ports
from areal_cli.transport.messages import GroupResult, Sample, WorkItem, encode

MIB = 1 << 20


def result(group_id: int) -> GroupResult:
    s = Sample(0, np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32),
               np.zeros(2, np.float32),
               np.zeros(2, np.int32), np.ones(2, np.uint8), 1.0, "ok", "stop", 1, "2")
    return GroupResult(group_id, f"p{group_id}", 0, [s], 0.1, 2)


def work(group_id: int) -> WorkItem:
    return WorkItem(group_id, f"p{group_id}", np.arange(3, dtype=np.int32), 2, 8, {}, 0)


def addr() -> str:
    return f"tcp://127.0.0.1:{free_ports('127.0.0.1', 1)[0]}"


def wait_for(cond, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def test_keys_are_private_to_the_user(tmp_path):
    path = make_keys(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    files = sorted(p.name for p in path.iterdir())
    assert files == ["client.key", "client.key_secret", "server.key", "server.key_secret"]
    assert all(stat.S_IMODE((path / f).stat().st_mode) == 0o600 for f in files)
    first = load_keys(tmp_path)
    make_keys(tmp_path)  # a new run start: fresh keys
    assert load_keys(tmp_path).client_secret != first.client_secret
    os.chmod(path, 0o750)
    with pytest.raises(ValueError, match="chmod -R go-rwx"):
        load_keys(tmp_path)


def test_a_client_without_the_keys_cannot_deliver_and_is_logged(keys, gate, tmp_path, caplog):
    a = addr()
    pull = Channel(zmq.PULL, a, bind=True, name="results", keys=keys, max_frame=MIB, gate=gate)
    ctx = zmq.Context.instance()
    plain = ctx.socket(zmq.PUSH)  # no CURVE at all
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(a)
    make_keys(tmp_path / "other")  # CURVE with the server's public key but another run's client key
    other = load_keys(tmp_path / "other")
    forged = ctx.socket(zmq.PUSH)
    forged.setsockopt(zmq.LINGER, 0)
    forged.curve_secretkey, forged.curve_publickey = other.client_secret, other.client_public
    forged.curve_serverkey = keys.server_public
    forged.connect(a)
    with caplog.at_level(logging.WARNING):
        for sock in (plain, forged):
            # best effort: the server may refuse the connection between a poll and the send
            # (zmq.Again)
            with contextlib.suppress(zmq.Again):
                sock.send(encode(result(1)), zmq.NOBLOCK)
        assert pull.recv(1.5) is None  # nothing got through
        assert wait_for(lambda: gate.refused >= 2)
    text = caplog.text
    assert "not a CURVE peer" in text and "results channel" in text  # the plain socket
    # ZAP, with its address
    assert "peer 127.0.0.1 presented a CURVE key that is not this run's" in text
    good = Channel(zmq.PUSH, a, bind=False, name="results", keys=keys, max_frame=MIB)
    good.send(result(2))
    assert pull.recv(5).group_id == 2  # the run's own client still gets through
    for s in (plain, forged):
        s.close(0)
    good.close()
    pull.close()


def test_a_strangers_pull_socket_receives_no_work(keys, gate):
    """Before: a PULL socket that connected got every other WorkItem (PUSH round-robins)."""
    a = addr()
    push = Channel(zmq.PUSH, a, bind=True, name="work", keys=keys, max_frame=MIB, gate=gate)
    stranger = zmq.Context.instance().socket(zmq.PULL)
    stranger.setsockopt(zmq.LINGER, 0)
    stranger.connect(a)
    worker = Channel(zmq.PULL, a, bind=False, name="work", keys=keys, max_frame=MIB)
    time.sleep(0.3)  # both connections settled (or refused)
    for i in range(6):
        push.send(work(i))
    got = [worker.recv(5) for _ in range(6)]
    assert [w.group_id for w in got if w is not None] == list(range(6))
    assert stranger.poll(300) == 0
    assert gate.refused >= 1
    stranger.close(0)
    worker.close()
    push.close()

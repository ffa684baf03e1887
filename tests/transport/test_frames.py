"""What a receiver does with frames that are not its channel's messages: count, log, drop, go on.
Frames are sent with the run's keys (authenticated), so only their content is wrong."""

from __future__ import annotations

import logging

import msgpack
import numpy as np
import pytest
import zmq

from areal_cli.transport.channels import Channel, free_ports
from areal_cli.transport.messages import (
    CHANNELS,
    BadFrame,
    Batch,
    GroupResult,
    Sample,
    Status,
    decode,
    encode,
)

MIB = 1 << 20


def result(group_id: int) -> GroupResult:
    s = Sample(0, np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32), np.zeros(2, np.float32),
               np.zeros(2, np.int32), np.ones(2, np.uint8), 1.0, "ok", "stop", 1, "2")
    return GroupResult(group_id, f"p{group_id}", 0, [s], 0.1, 2)


def pair(keys, gate, name: str, max_frame: int = MIB):
    a = f"tcp://127.0.0.1:{free_ports('127.0.0.1', 1)[0]}"
    pull = Channel(zmq.PULL, a, bind=True, name=name, keys=keys, max_frame=max_frame, gate=gate)
    push = Channel(zmq.PUSH, a, bind=False, name=name, keys=keys, max_frame=64 * MIB)
    return pull, push


def body(**change) -> dict:
    """A well-formed GroupResult frame's map, with ``change`` applied to its first sample."""
    raw = msgpack.unpackb(encode(result(1)), raw=False)
    raw["body"]["samples"][0].update(change)
    return raw


def array(a: np.ndarray) -> dict:
    return {"__nd__": True, "dtype": a.dtype.str, "shape": list(a.shape), "data": a.tobytes()}


BAD = {
    "garbage": b"\x00\xffnot msgpack at all",
    "truncated": encode(result(1))[:-5],
    "a list": msgpack.packb([1, 2, 3]),
    "no body": msgpack.packb({"type": "GroupResult"}),
    "unknown type": msgpack.packb({"type": "Pickle", "body": {}}),
    "missing field": msgpack.packb({"type": "GroupResult", "body": {"group_id": 1}}),
    "extra field": msgpack.packb({**body(), "body": {**body()["body"], "path": "/etc"}}),
    "string for int": msgpack.packb({**body(), "body": {**body()["body"], "group_id": "1"}}),
    "object array": msgpack.packb(body(logprobs={**array(np.zeros(2, np.float32)), "dtype": "|O"})),
    "lengths differ": msgpack.packb(body(logprobs=array(np.zeros(5, np.float32)))),
    "2-D tokens": msgpack.packb(body(output_ids=array(np.zeros((1, 2), np.int32)))),
    "shape lies": msgpack.packb(body(versions={**array(np.zeros(2, np.int32)), "shape": [7]})),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_decode_rejects_every_malformed_shape(name):
    with pytest.raises(BadFrame):
        decode(BAD[name], CHANNELS["results"])


def test_each_channel_accepts_only_its_types():
    status = encode(Status("trainer-0", "bye"))
    assert isinstance(decode(status, CHANNELS["status"]), Status)
    for channel in ("work", "results", "batches", "control"):
        with pytest.raises(BadFrame, match="on a channel that carries"):
            decode(status, CHANNELS[channel])
    with pytest.raises(BadFrame, match="unknown kind"):
        decode(encode(Status("trainer-0", "rename_checkpoint")), CHANNELS["status"])
    b = decode(encode(Batch(0, 0, [result(3)])), CHANNELS["batches"])
    assert isinstance(b.groups[0], GroupResult) and b.groups[0].samples[0].logprobs.dtype == np.float32


def test_malformed_and_misrouted_frames_are_dropped_and_counted(keys, gate, caplog):
    pull, push = pair(keys, gate, "results")
    with caplog.at_level(logging.WARNING):
        push.sock.send(encode(Status("trainer-0", "weights_ready", version=9)))  # valid, wrong channel
        for frame in BAD.values():
            push.sock.send(frame)
        push.sock.send_multipart([encode(result(5)), b"x"])  # two frames where one is expected
        push.send(result(7))
        got = pull.recv(5)
    assert got is not None and got.group_id == 7  # the receiver kept working
    assert pull.dropped == len(BAD) + 2
    assert "a Status on a channel that carries GroupResult" in caplog.text
    assert "from 127.0.0.1" in caplog.text  # the peer is named
    pull.close()
    push.close()


def test_an_oversized_frame_is_refused(keys, gate):
    """Before: no limit (a 400 MiB frame was accepted). The receiver drops the connection of a
    peer whose frame exceeds ZMQ_MAXMSGSIZE; the sender refuses to send one, naming the setting."""
    pull, push = pair(keys, gate, "results", max_frame=MIB)
    big = result(1)
    big.samples[0].completion = "x" * (2 * MIB)
    push.sock.send(encode(big))  # past the sender's own check: what a hostile peer could do
    assert pull.recv(1.5) is None
    small = Channel(zmq.PUSH, pull.addr, bind=False, name="results", keys=keys, max_frame=MIB)
    with pytest.raises(ValueError, match="launcher.max_frame_mb"):
        small.send(big)
    small.send(result(2))
    assert pull.recv(5).group_id == 2  # and the receiver goes on
    for c in (pull, push, small):
        c.close()

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
    REGISTRY,
    SENDERS,
    Asleep,
    BadFrame,
    Batch,
    Bye,
    CheckpointWritten,
    GroupResult,
    Heartbeat,
    Hello,
    Phase,
    RewardReply,
    RewardRequest,
    RewardTaken,
    Sample,
    Sleep,
    StaleBefore,
    StepDone,
    Stop,
    UpdateWeights,
    WeightsLoaded,
    WeightsReady,
    WorkItem,
    decode,
    encode,
    may_send,
)

MIB = 1 << 20


def result(group_id: int) -> GroupResult:
    s = Sample(0, np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32),
               np.zeros(2, np.float32),
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
    "nested reward parts": msgpack.packb(body(reward_parts={"judge": {"score": 1}})),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_decode_rejects_every_malformed_shape(name):
    with pytest.raises(BadFrame):
        decode(BAD[name], CHANNELS["results"])


EXAMPLES = {  # one well-formed message of every registered type
    WorkItem: WorkItem(1, "p1", np.arange(3, dtype=np.int32), 2, 8, {}, 0),
    Sample: result(1).samples[0],
    GroupResult: result(2),
    Batch: Batch(0, [result(3)]),
    UpdateWeights: UpdateWeights(3),
    StaleBefore: StaleBefore(2),
    Sleep: Sleep(4),
    Asleep: Asleep("rollout-0", 4, {"sleep_s": 0.2, "freed_bytes": 1 << 30}),
    Stop: Stop(),
    Hello: Hello("rollout-0"),
    Heartbeat: Heartbeat("trainer-0", "sending weights of version 3", 7,
                         phase=Phase.sending_weights, version=3),
    WeightsReady: WeightsReady("trainer-0", 3),
    StepDone: StepDone("trainer-0", 3, {"loss": 0.5, "note": "x"}, checkpoint=True),
    CheckpointWritten: CheckpointWritten("trainer-0", 3),
    Bye: Bye("trainer-0", finished=True),
    WeightsLoaded: WeightsLoaded("rollout-1", 3, {"pause_total_s": 0.1}),
    RewardRequest: RewardRequest(4, "judge", "What is 3 + 4?", "7", "{problem} Answer: 7"),
    RewardTaken: RewardTaken(4),
    RewardReply: RewardReply(4, 0.75, "ok", "", 8, 2),
}


def test_every_message_type_is_covered_and_round_trips():
    assert set(EXAMPLES) == set(REGISTRY.values())
    for msg in EXAMPLES.values():
        back = decode(encode(msg))
        assert type(back) is type(msg) and encode(back) == encode(msg)


@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_each_channel_accepts_exactly_its_types(channel):
    for cls, msg in EXAMPLES.items():
        if cls in CHANNELS[channel]:
            assert type(decode(encode(msg), CHANNELS[channel])) is cls
        else:
            with pytest.raises(BadFrame, match="on a channel that carries"):
                decode(encode(msg), CHANNELS[channel])


def test_the_channel_table():
    names = lambda ch: {c.__name__ for c in CHANNELS[ch]}  # noqa: E731
    assert (names("work") == {"WorkItem"} and names("results") == {"GroupResult"}
            and names("batches") == {"Batch"})
    assert names("control") == {"UpdateWeights", "StaleBefore", "Sleep",
                                "Stop"} and names("ranks") == {"Batch", "Stop"}
    assert names("status") == {"Hello", "Heartbeat", "WeightsReady", "StepDone",
                               "CheckpointWritten", "Bye",
                               "WeightsLoaded", "Asleep"}
    assert set(CHANNELS["status"]) == set(SENDERS)  # every status message says who may send it
    nested = {Sample}  # travels only inside a GroupResult
    assert set(REGISTRY.values()) == nested | {c for types in CHANNELS.values() for c in types}


def test_who_may_send_which_status_message():
    everyone = {Hello, Heartbeat}
    trainer = {WeightsReady, StepDone, CheckpointWritten, Bye}
    for cls in SENDERS:
        assert may_send(cls, "trainer-0") == (cls in everyone | trainer)
        assert may_send(cls, "rollout-3") == (cls in everyone | {WeightsLoaded, Asleep})
        assert not may_send(cls, "trainer-1") or cls in everyone
    assert not may_send(WorkItem, "trainer-0")  # not a status message at all


def test_status_messages_are_checked_field_by_field():
    with pytest.raises(BadFrame, match="unknown message type"):
        decode(msgpack.packb({"type": "RenameCheckpoint", "body": {"sender": "trainer-0"}}),
               CHANNELS["status"])
    with pytest.raises(BadFrame, match="metrics must map names to numbers"):
        decode(encode(StepDone("trainer-0", 1, {"x": [1, 2]})), CHANNELS["status"])
    with pytest.raises(BadFrame, match="unknown field"):  # no path rides along
        decode(msgpack.packb({"type": "CheckpointWritten",
                              "body": {"sender": "trainer-0", "version": 1,
                                                                    "path": "/etc"}}),
               CHANNELS["status"])
    with pytest.raises(BadFrame, match="expected int"):
        decode(msgpack.packb({"type": "WeightsReady",
                              "body": {"sender": "trainer-0", "version": "1"}}),
               CHANNELS["status"])
    b = decode(encode(Batch(0, [result(3)])), CHANNELS["batches"])
    assert isinstance(b.groups[0],
                      GroupResult) and b.groups[0].samples[0].logprobs.dtype == np.float32


def test_a_heartbeat_phase_is_one_of_its_words_and_older_peers_default_to_other():
    back = decode(encode(Heartbeat("rollout-1", "receiving", 3, 2, Phase.receiving_weights, 4)),
                  CHANNELS["status"])
    # a member, not a bare string
    assert back.phase is Phase.receiving_weights and back.version == 4
    old = msgpack.packb({"type": "Heartbeat",
                         "body": {"sender": "rollout-1", "doing": "x", "progress": 3}})
    back = decode(old, CHANNELS["status"])  # sent before heartbeats had a phase
    assert (back.phase, back.version, back.busy) == (Phase.other, -1, -1)
    for phase in ("sending weights", 1):
        frame = msgpack.packb({"type": "Heartbeat",
                               "body": {"sender": "rollout-1", "doing": "x", "progress": 3,
                                                             "phase": phase}})
        with pytest.raises(BadFrame,
                           match="Heartbeat.phase: expected one of other, sending_weights"):
            decode(frame, CHANNELS["status"])


def test_malformed_and_misrouted_frames_are_dropped_and_counted(keys, gate, caplog):
    pull, push = pair(keys, gate, "results")
    with caplog.at_level(logging.WARNING):
        push.sock.send(encode(WeightsReady("trainer-0", 9)))  # valid, wrong channel
        for frame in BAD.values():
            push.sock.send(frame)
        push.sock.send_multipart([encode(result(5)), b"x"])  # two frames where one is expected
        push.send(result(7))
        got = pull.recv(5)
    assert got is not None and got.group_id == 7  # the receiver kept working
    assert pull.dropped == len(BAD) + 2
    assert "a WeightsReady on a channel that carries GroupResult" in caplog.text
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

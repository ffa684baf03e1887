import time

import numpy as np
import zmq

from areal_cli.transport.channels import Channel, free_ports
from areal_cli.transport.messages import Batch, GroupResult, Sample, decode, encode

MIB = 1 << 20


def _sample(i):
    return Sample(i, np.arange(4, dtype=np.int32), np.arange(3, dtype=np.int32),
                  np.array([-0.5, -1.0, -2.0], np.float32), np.array([0, 0, 1], np.int32),
                  np.ones(3, np.uint8), 1.0, "ok", "stop", 1, "Answer: 3")


def test_round_trip_keeps_arrays_raw_and_typed():
    b = Batch(3, 3, [GroupResult(7, "p", 0, [_sample(0), _sample(1)], 0.5, 6)])
    frame = encode(b)
    assert b"pickle" not in frame
    got = decode(frame)
    s = got.groups[0].samples[1]
    assert isinstance(s, Sample) and s.logprobs.dtype == np.float32
    assert np.array_equal(s.versions, [0, 0, 1]) and got.groups[0].group_id == 7


def test_receive_times_out_instead_of_hanging(keys, gate):
    port = free_ports("127.0.0.1", 1)[0]
    pull = Channel(zmq.PULL, f"tcp://127.0.0.1:{port}", bind=True, name="results", keys=keys, max_frame=MIB,
                   gate=gate)
    t0 = time.monotonic()
    assert pull.recv(0.2) is None
    assert 0.15 < time.monotonic() - t0 < 2
    push = Channel(zmq.PUSH, f"tcp://127.0.0.1:{port}", bind=False, name="results", keys=keys, max_frame=MIB)
    push.send(GroupResult(1, "p", 0, [_sample(0)], 0.5, 3))
    assert pull.recv(5).samples[0].completion == "Answer: 3"
    pull.close()
    push.close()

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from areal_cli.transport.channels import Channel, free_ports
from areal_cli.transport.messages import Batch, GroupResult, Sample, Stop, decode, encode

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def _sample(i):
    return Sample(i, np.arange(4, dtype=np.int32), np.arange(3, dtype=np.int32),
                  np.array([-0.5, -1.0, -2.0], np.float32), np.array([0, 0, 1], np.int32),
                  np.ones(3, np.uint8), 1.0, "ok", "stop", 1, "Answer: 3")


def test_round_trip_keeps_arrays_raw_and_typed():
    b = Batch(3, [GroupResult(7, "p", 0, [_sample(0), _sample(1)], 0.5, 6)])
    frame = encode(b)
    assert b"pickle" not in frame
    got = decode(frame)
    s = got.groups[0].samples[1]
    assert isinstance(s, Sample) and s.logprobs.dtype == np.float32
    assert np.array_equal(s.versions, [0, 0, 1]) and got.groups[0].group_id == 7


def test_receive_times_out_instead_of_hanging(keys, gate):
    port = free_ports("127.0.0.1", 1)[0]
    pull = Channel(zmq.PULL, f"tcp://127.0.0.1:{port}", bind=True, name="results", keys=keys,
                   max_frame=MIB,
                   gate=gate)
    t0 = time.monotonic()
    assert pull.recv(0.2) is None
    assert 0.15 < time.monotonic() - t0 < 2
    push = Channel(zmq.PUSH, f"tcp://127.0.0.1:{port}", bind=False, name="results", keys=keys,
                   max_frame=MIB)
    push.send(GroupResult(1, "p", 0, [_sample(0)], 0.5, 3))
    assert pull.recv(5).samples[0].completion == "Answer: 3"
    pull.close()
    push.close()


CHILD = """
import logging, sys, time, zmq
from areal_cli.transport.auth import Gatekeeper, load_keys
from areal_cli.transport.channels import Channel, shutdown
from areal_cli.transport.messages import Stop
keys = load_keys(sys.argv[2])
gate = Gatekeeper(keys, logging.getLogger("child"))
pub = Channel(zmq.PUB, sys.argv[1], bind=True, name="control", keys=keys, max_frame=1 << 20,
              gate=gate)
sys.stdin.readline()  # the subscriber is connected
time.sleep(0.3)  # and its subscription has arrived
pub.send(Stop())
pub.close(linger_s=1.0)
gate.stop()
shutdown()
from areal_cli.runtime import exit_now
exit_now(0)  # as run_main ends every process
"""


@pytest.mark.slow  # ~25 s on 2 cores: `make test-slow`, which CI runs too
def test_the_last_message_before_exit_is_delivered(keys, tmp_path):
    """The controller's last Stop to the rollout workers: sent, then the process exits at once.
    Without the linger and ``shutdown`` the message was lost in some of 10 tries (a race)."""
    from zmq.utils.monitor import recv_monitor_message

    for _ in range(10):
        addr = f"tcp://127.0.0.1:{free_ports('127.0.0.1', 1)[0]}"
        child = subprocess.Popen([sys.executable, "-c", CHILD, addr, str(tmp_path)],
                                 stdin=subprocess.PIPE,
                                 text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        sub = Channel(zmq.SUB, addr, bind=False, name="control", keys=keys, max_frame=MIB)
        mon = sub.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        assert (mon.poll(20000) and recv_monitor_message(mon)["event"]
                == zmq.EVENT_HANDSHAKE_SUCCEEDED)
        child.stdin.write("go\n")
        child.stdin.flush()
        got = sub.recv(10)
        assert child.wait(30) == 0
        assert isinstance(got, Stop)
        sub.sock.disable_monitor()
        mon.close(0)
        sub.close()

"""The controller against frames a legitimate peer never sends: a real controller (its sockets
bound on loopback, the run's keys) and a client holding the keys. Before, one status frame
carrying a path renamed a directory and deleted its step_* siblings, a forged weights_ready
raised the policy version, forged error/bye ended the run and any malformed frame killed it."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from areal_cli.config.schema import RootConfig
from areal_cli.controller.main import Controller
from areal_cli.launcher.plan import make_plan
from areal_cli.runtime import load_endpoints
from areal_cli.transport.auth import load_keys
from areal_cli.transport.channels import Channel, status_sender
from areal_cli.transport.messages import GroupResult, Sample, Status

MIB = 1 << 20


@pytest.fixture
def ctl(tmp_path, tiny_model):
    cfg = RootConfig(run_dir=str(tmp_path / "run"), model=str(tiny_model))
    cfg.task.size = 16
    plan = make_plan(cfg, gpus=[])
    plan.write()
    c = Controller(str(plan.run_dir))
    yield c
    for ch in (c.status, c.work, c.results, c.batches, c.control):
        ch.close()
    c.gate.stop()  # not c.close(): that ends ZeroMQ in this (test) process


def client(ctl, name: str):
    return status_sender(load_endpoints(ctl.run_dir).status, name, load_keys(ctl.run_dir), MIB)


def pump(ctl, until, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not until() and time.monotonic() < deadline:
        ctl._handle_status()
        ctl._collect()
        time.sleep(0.01)


def test_no_path_travels_a_status_with_one_moves_nothing(ctl, tmp_path):
    victim = tmp_path / "victim"
    for d in ("step_1", "step_2", "step_3.partial"):
        (victim / d).mkdir(parents=True)
        (victim / d / "trainer.json").write_text("{}")
    trainer = client(ctl, "trainer-0")
    path = str(victim / "step_3.partial")
    trainer.send(Status("trainer-0", "checkpoint", version=0, metrics={"checkpoint": path}))
    trainer.send(Status("trainer-0", "step_done", version=0, metrics={"checkpoint": path}))
    pump(ctl, lambda: ctl.unexpected >= 2)
    assert sorted(p.name for p in victim.iterdir()) == ["step_1", "step_2", "step_3.partial"]
    assert ctl.unexpected == 2  # checkpoint 0 was never written; no batch was being trained
    assert not (ctl.run_dir / "metrics.jsonl").exists() or "checkpoint" not in (
        ctl.run_dir / "metrics.jsonl").read_text()
    trainer.close()


def test_forged_status_frames_are_dropped_and_the_controller_goes_on(ctl):
    rollout, stranger, trainer = client(ctl, "rollout-0"), client(ctl, "mallory"), client(ctl, "trainer-0")
    trainer.send(Status("trainer-0", "weights_ready", version=7))  # no batch 6 was ever sent
    rollout.send(Status("rollout-0", "bye"))  # only the trainer ends the run
    rollout.send(Status("rollout-0", "step_done", version=0))
    stranger.send(Status("mallory", "error", text="stop everything"))
    for junk in (b"\x93garbage", b"", b"\xc1"):  # malformed frames on the status socket
        trainer.sock.send(junk)
    trainer.send(Status("trainer-0", "hello"))  # and then a legitimate one
    pump(ctl, lambda: ctl.trainer_ready)
    assert ctl.trainer_ready and not ctl.done
    assert ctl.adm.version == 0 and ctl.pending_update is None  # the staleness bound holds
    assert ctl.unexpected == 4 and ctl.status.dropped == 3
    for c in (rollout, stranger, trainer):
        c.close()


def test_malformed_and_unknown_results_are_dropped(ctl):
    keys, ep = load_keys(ctl.run_dir), load_endpoints(ctl.run_dir)
    push = Channel(zmq.PUSH, ep.results, bind=False, name="results", keys=keys, max_frame=MIB)
    worker = Channel(zmq.PULL, ep.work, bind=False, name="work", keys=keys, max_frame=MIB)
    s = Sample(0, np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32), np.zeros(2, np.float32),
               np.zeros(2, np.int32), np.ones(2, np.uint8), 1.0, "ok", "stop", 1, "2")
    push.sock.send(b"\x00not a result")
    push.send(GroupResult(999, "p", 0, [s] * ctl.cfg.rollout.group_size, 0.1, 2))  # never admitted
    deadline = time.monotonic() + 5
    while not ctl.groups and time.monotonic() < deadline:  # until the worker's connection is up
        ctl._admit()
        time.sleep(0.02)
    gid = min(ctl.groups)
    push.send(GroupResult(gid, "p", 0, [s], 0.1, 2))  # too few samples for the group
    pump(ctl, lambda: ctl.results.dropped and ctl.unexpected)
    assert ctl.results.dropped == 1 and ctl.unexpected == 1 and not ctl.buffer
    push.send(GroupResult(gid, "p", 0, [s] * ctl.cfg.rollout.group_size, 0.1, 2))
    pump(ctl, lambda: ctl.buffer)
    assert [g.group_id for g in ctl.buffer] == [gid]  # a well-formed result still counts
    push.close()
    worker.close()

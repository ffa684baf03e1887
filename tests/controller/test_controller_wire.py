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
from areal_cli.transport.auth import load_keys
from areal_cli.transport.channels import Channel, Endpoints, status_sender
from areal_cli.transport.messages import (
    Bye,
    CheckpointWritten,
    GroupResult,
    Hello,
    Sample,
    StepDone,
    WeightsReady,
    WorkItem,
)

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
    return status_sender(Endpoints.load(ctl.run_dir).status, name, load_keys(ctl.run_dir), MIB)


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
    trainer.send(CheckpointWritten("trainer-0", 0))
    trainer.send(StepDone("trainer-0", 0, metrics={"checkpoint": path}, checkpoint=True))
    pump(ctl, lambda: ctl.unexpected >= 2)
    assert sorted(p.name for p in victim.iterdir()) == ["step_1", "step_2", "step_3.partial"]
    assert ctl.unexpected == 2  # checkpoint 0 was never written; no batch was being trained
    assert not (ctl.run_dir / "metrics.jsonl").exists() or "checkpoint" not in (
        ctl.run_dir / "metrics.jsonl").read_text()
    trainer.close()


def test_forged_status_frames_are_dropped_and_the_controller_goes_on(ctl):
    rollout, stranger, trainer = client(ctl, "rollout-0"), client(ctl, "mallory"), client(ctl,
                                                                                          "trainer-0")
    trainer.send(WeightsReady("trainer-0", 7))  # no batch 6 was ever sent
    rollout.send(Bye("rollout-0", finished=True))  # only the trainer ends the run
    rollout.send(StepDone("rollout-0", 0, {}))
    stranger.send(Bye("mallory", finished=False))
    for junk in (b"\x93garbage", b"", b"\xc1"):  # malformed frames on the status socket
        trainer.sock.send(junk)
    trainer.send(Hello("trainer-0"))  # and then a legitimate one
    pump(ctl, lambda: ctl.trainer_ready)
    assert ctl.trainer_ready and not ctl.done
    assert ctl.adm.version == 0 and ctl.orders.pending is None  # the staleness bound holds
    assert ctl.unexpected == 4 and ctl.status.dropped == 3
    for c in (rollout, stranger, trainer):
        c.close()


def test_malformed_and_unknown_results_are_dropped(ctl):
    keys, ep = load_keys(ctl.run_dir), Endpoints.load(ctl.run_dir)
    push = Channel(zmq.PUSH, ep.results, bind=False, name="results", keys=keys, max_frame=MIB)
    worker = Channel(zmq.PULL, ep.work, bind=False, name="work", keys=keys, max_frame=MIB)
    s = Sample(0, np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32),
               np.zeros(2, np.float32),
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


def test_every_status_message_has_a_handler_and_acts(ctl):
    """The dispatch table covers the status channel's types; each message does what it says."""
    from areal_cli.transport.messages import CHANNELS, Heartbeat, Phase, WeightsLoaded

    assert set(ctl.on) == set(CHANNELS["status"])
    trainer, rollout = client(ctl, "trainer-0"), client(ctl, "rollout-0")
    rollout.send(Hello("rollout-0"))
    rollout.send(Heartbeat("rollout-0", "generating (3 groups)", progress=5, busy=3))
    trainer.send(Heartbeat("trainer-0", "sending weights", progress=1, phase=Phase.sending_weights,
                           version=1))
    peers = ctl.peers
    pump(ctl, lambda: "trainer-0" in peers.doing)
    assert peers.rollouts_up == {"rollout-0"}
    assert peers.doing["rollout-0"] == "generating (3 groups)"
    # culprits() reads
    assert peers.phase == {"rollout-0": (Phase.other, -1), "trainer-0": (Phase.sending_weights, 1)}
    assert peers.watch.peers["rollout-0"].busy and peers.watch.peers["rollout-0"].progress == 5
    assert not peers.watch.peers["trainer-0"].busy  # busy -1: the trainer does not say; unchanged
    trainer.send(WeightsReady("trainer-0", 0))  # resume at version 0
    pump(ctl,
         lambda: ctl.orders.pending is None and ctl.adm.version == 0
         and peers.last_seen.get("trainer-0"))
    rollout.send(WeightsLoaded("rollout-0", 1, {"pause_total_s": 0.25}))
    pump(ctl, lambda: ctl.rec.pauses)
    assert (ctl.rec.pauses == [0.25]
            and '"pause_total_s": 0.25' in (ctl.run_dir / "weight_updates.jsonl").read_text())
    # what culprits() reads when the trainer hangs sending weights
    assert peers.loaded == {"rollout-0": 1}
    assert not ctl.done
    trainer.send(Bye("trainer-0", finished=True))
    pump(ctl, lambda: ctl.done)
    assert ctl.done and ctl.unexpected == 0
    for c in (trainer, rollout):
        c.close()


def test_endpoints_json_is_the_bound_addresses_and_work_items_carry_no_sampling(ctl):
    """The controller publishes what it bound (port_base=0: the OS chose); the launcher wrote
    none."""
    ep = Endpoints.load(ctl.run_dir)
    assert ep.work == ctl.work.addr and ep.status == ctl.status.addr and not ep.work.endswith(":0")
    assert (ctl.run_dir / "controller.ready").is_file()
    assert {f for f in WorkItem.__dataclass_fields__} == {
        "group_id", "prompt_id", "prompt_ids", "group_size", "max_new_tokens", "problem",
        "min_version"}


def test_a_weight_update_order_lost_to_a_late_subscriber_is_repeated(ctl, monkeypatch):
    """A PUB frame sent before a subscriber's subscription arrives is lost; the rollout worker then
    never joins the broadcast and the trainer waits in it until the collective times out. The
    controller repeats the order until the worker has begun to receive (its heartbeat) or loaded."""
    import areal_cli.controller.weight_orders as weight_orders
    from areal_cli.transport.messages import Heartbeat, Phase, UpdateWeights, WeightsLoaded

    monkeypatch.setattr(weight_orders, "UPDATE_REPEAT_S", 0.2)
    trainer, rollout = client(ctl, "trainer-0"), client(ctl, "rollout-0")
    rollout.send(Hello("rollout-0"))  # said hello; its control subscription is not there yet
    trainer.send(WeightsReady("trainer-0", 0))  # the resumed weights, version 0
    pump(ctl, lambda: ctl.orders.sent == 0)
    assert ctl.orders.sent == 0  # the first order went out to no subscriber
    ep, keys = Endpoints.load(ctl.run_dir), load_keys(ctl.run_dir)
    sub = Channel(zmq.SUB, ep.control, name="control", bind=False, keys=keys, max_frame=MIB)
    got = []

    def heard():
        msg = sub.recv(0)
        if msg is not None:
            got.append(msg)
        return bool(got)

    pump(ctl, heard)
    assert isinstance(got[0], UpdateWeights) and got[0].version == 0 and ctl.orders.repeats[0] >= 1
    rollout.send(Heartbeat("rollout-0", "receiving weights", progress=1,
                           phase=Phase.receiving_weights, version=0))
    pump(ctl, lambda: ctl.orders.sent is None)
    assert ctl.orders.sent is None  # joined: no more orders
    repeats = ctl.orders.repeats[0]
    rollout.send(WeightsLoaded("rollout-0", 0, {"pause_total_s": 0.1}))
    pump(ctl, lambda: ctl.peers.loaded.get("rollout-0") == 0)
    time.sleep(0.3)
    ctl._handle_status()
    assert ctl.orders.repeats[0] == repeats and ctl.unexpected == 0
    for c in (trainer, rollout, sub):
        c.close()


def test_each_batch_tells_the_workers_which_groups_no_later_batch_can_take(ctl):
    from areal_cli.tasks import Problem
    from areal_cli.transport.messages import Batch, StaleBefore

    ep, keys = Endpoints.load(ctl.run_dir), load_keys(ctl.run_dir)
    sub = Channel(zmq.SUB, ep.control, name="control", bind=False, keys=keys, max_frame=MIB)
    trainer = Channel(zmq.PULL, ep.batches, bind=False, name="batches", keys=keys, max_frame=MIB)
    time.sleep(0.3)  # the subscription reaches the controller's socket first
    ctl.cfg.rollout.max_staleness, B, G = 1, ctl.cfg.trainer.batch_size, ctl.cfg.rollout.group_size
    s = Sample(0, np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32),
               np.zeros(2, np.float32),
               np.ones(2, np.int32), np.ones(2, np.uint8), 1.0, "ok", "stop", 1, "2")
    heard = []
    for step in (0, 1):
        for g in range(B):
            gid = 100 * step + g
            ctl.groups[gid] = (gid, f"p{gid}", Problem(f"p{gid}", "1 + 1?", "2", {}))
            ctl.buffer.append(GroupResult(gid, f"p{gid}", 0, [s] * G, 0.1, 2 * G))
        ctl.trainer_ready = True
        ctl._maybe_send_batch()
        assert isinstance(trainer.recv(5.0), Batch) and ctl.step == step + 1
        msg = sub.recv(0.5)
        heard.append(msg.version if isinstance(msg, StaleBefore) else None)
    # after batch 0 every batch to come (1, 2, ...) takes groups begun at version 0; after batch 1
    # none does
    assert heard == [None, 1]
    sub.close()
    trainer.close()


def test_a_group_with_a_failed_episode_trains_when_it_comes_with_samples(ctl):
    """workflow.agent_failed_episode=reward_zero sends a failed episode's calls at reward 0: such a
    group is buffered for training, its failure still counted; a failed group without samples
    (drop_group) is not."""
    keys, ep = load_keys(ctl.run_dir), Endpoints.load(ctl.run_dir)
    push = Channel(zmq.PUSH, ep.results, bind=False, name="results", keys=keys, max_frame=MIB)
    worker = Channel(zmq.PULL, ep.work, bind=False, name="work", keys=keys, max_frame=MIB)
    G = ctl.cfg.rollout.group_size

    def sample(i: int, reward: float, status: str) -> Sample:
        return Sample(i, np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32),
                      np.zeros(2, np.float32), np.zeros(2, np.int32), np.ones(2, np.uint8), reward,
                      status, "stop", 1, "2", episode=i)

    deadline = time.monotonic() + 5
    while len(ctl.groups) < 2 and time.monotonic() < deadline:
        ctl._admit()
        time.sleep(0.02)
    dropped, zeroed = sorted(ctl.groups)[:2]
    counts = {"agent_episodes": float(G), "agent_failed": 1.0}
    push.send(GroupResult(dropped, "p", 0, [], 0.1, 2, failed=1, counters=counts))
    samples = [sample(0, 0.0, "agent_failed")] + [sample(i, 1.0, "ok") for i in range(1, G)]
    push.send(GroupResult(zeroed, "p", 0, samples, 0.1, 2, failed=1, counters=counts))
    pump(ctl, lambda: ctl.buffer)
    assert [g.group_id for g in ctl.buffer] == [zeroed] and dropped not in ctl.groups
    assert ctl.rec.window["agent_failed"] == 2
    push.close()
    worker.close()

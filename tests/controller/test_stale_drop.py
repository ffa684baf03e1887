"""The controller's drop of buffered groups older than rollout.max_staleness: the slot is freed, the
prompt requeued, and the group's generated tokens counted (``stale_dropped_tokens``: generated,
never trained)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from areal_cli.config.schema import RootConfig
from areal_cli.controller.admission import Admission
from areal_cli.controller.main import Controller
from areal_cli.controller.records import StepRecorder
from areal_cli.transport.messages import GroupResult, Sample


def group(gid: int, first_version: int, model_tokens: int, env_tokens: int = 0) -> GroupResult:
    n = model_tokens + env_tokens
    versions = np.full(n, first_version, np.int32)
    versions[model_tokens:] = -1
    mask = np.zeros(n, np.uint8)
    mask[:model_tokens] = 1
    sample = Sample(0, np.zeros(3, np.int32), np.arange(n, dtype=np.int32), np.zeros(n, np.float32),
                    versions, mask,
                    0.0, "ok", "length", 1, "")
    return GroupResult(gid, f"p{gid}", 0, [sample, sample], 1.0, 2 * n)


class Cursor:
    def __init__(self):
        self.requeued = []

    def requeue(self, *entry):
        self.requeued.append(entry)


def test_a_group_past_the_staleness_bound_is_dropped_requeued_and_its_tokens_counted(tmp_path):
    cfg = RootConfig()
    cfg.rollout.max_staleness = 2
    fresh, stale = group(1, first_version=3, model_tokens=40), group(2, first_version=2,
                                                                     model_tokens=30, env_tokens=5)
    adm = Admission(batch_size=2, max_staleness=2, max_concurrent=10, accepted=2)
    ctl = SimpleNamespace(cfg=cfg, step=5, buffer=[fresh, stale], adm=adm,
                          rec=StepRecorder(tmp_path, cfg),
                          cursor=Cursor(), groups={1: (1, "p1", None), 2: (2, "p2", None)})
    Controller._drop_stale(ctl)
    # 5 - 3 = 2 is within the bound; 5 - 2 = 3 is not
    assert [g.group_id for g in ctl.buffer] == [1]
    assert ctl.adm.accepted == 1 and ctl.cursor.requeued == [(2, "p2",
                                                              None)] and 2 not in ctl.groups
    assert ctl.rec.stale_dropped == 1
    # model tokens of both samples; the env turn's are no generation
    assert ctl.rec.stale_dropped_tokens == 2 * 30


def test_the_controller_says_once_when_stale_drops_waste_a_fifth_of_generation(tmp_path, caplog):
    import logging

    rec, log = StepRecorder(tmp_path, RootConfig()), logging.getLogger("areal-test-controller")
    rec.gen_tokens_total, rec.stale_dropped_tokens, rec.stale_dropped = 1000, 150, 3
    with caplog.at_level(logging.WARNING, logger="areal-test-controller"):
        rec.warn_stale_waste(9, log)
        assert not caplog.records  # 15%: within what the bound costs
        rec.stale_dropped_tokens = 440
        rec.warn_stale_waste(4, log)
        assert not caplog.records  # too early to judge
        rec.warn_stale_waste(5, log)
        rec.warn_stale_waste(6, log)
    assert len(caplog.records) == 1
    said = caplog.records[0].getMessage()
    assert said.startswith("44% of the tokens generated so far were of groups dropped as older "
                           "than rollout.max_staleness=4") and "Raise rollout.max_staleness" in said


def test_after_a_resume_the_waste_counts_only_what_this_controller_saw(tmp_path):
    rec = StepRecorder(tmp_path, RootConfig())
    rec.stale_dropped_tokens = rec.stale_tokens_at_start = 5000  # restored from the checkpoint
    rec.gen_tokens_total = 1000
    assert rec.stale_waste() == 0.0
    rec.stale_dropped_tokens += 300
    assert rec.stale_waste() == 0.3


def test_a_group_its_worker_stopped_as_stale_frees_its_slot_and_is_drawn_again(tmp_path):
    cfg = RootConfig()
    adm = Admission(batch_size=2, max_staleness=2, max_concurrent=10, running=3)
    ctl = SimpleNamespace(cfg=cfg, adm=adm, rec=StepRecorder(tmp_path, cfg), cursor=Cursor(),
                          groups={7: (7, "p7", None), 8: (8, "p8", None)}, buffer=[], log=None)
    ctl._stopped_stale = lambda g: Controller._stopped_stale(ctl, g)
    stopped = GroupResult(7, "p7", 0, [], 12.0, 900, stale=True)
    Controller._on_result(ctl, stopped)
    assert ctl.adm.running == 2 and ctl.adm.accepted == 0  # the slot is free, nothing was accepted
    assert ctl.cursor.requeued == [(7, "p7", None)] and 7 not in ctl.groups and ctl.buffer == []
    assert ctl.rec.stale_stopped == 1 and ctl.rec.stale_dropped == 0
    # generated, never trained
    assert ctl.rec.stale_dropped_tokens == 900 and ctl.rec.gen_tokens_total == 900
    assert ctl.rec.stale_waste() == 1.0

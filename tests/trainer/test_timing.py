"""The step-time breakdown (``time/<part>_s`` in every step's metrics): its parts tile the step."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import init_gloo, make_batch, plain_model, step_runner

from areal_cli.trainer.timing import StepClock

STEP_PARTS = {"prepare", "forward", "head_forward", "loss", "head_backward", "backward",
              "optimizer", "stats"}


def test_each_mark_takes_the_time_since_the_previous_one():
    # sleeps of 30, 60 and 30 ms: "a" gets the first and the third (parts add up), "b" the second
    clock = StepClock(torch.device("cpu"))
    clock.start()
    for part, sleep in (("a", 0.03), ("b", 0.06), ("a", 0.03)):
        time.sleep(sleep)
        clock.mark(part)
    out = clock.parts()
    assert set(out) == {"time/a_s", "time/b_s", "time/step_s"}
    assert out["time/a_s"] == pytest.approx(0.06,
                                            abs=0.015) and out["time/b_s"] == pytest.approx(0.06,
                                                                                            abs=0.015)
    assert out["time/a_s"] + out["time/b_s"] == pytest.approx(out["time/step_s"], rel=0.01)
    assert clock.parts() == {}  # a step's marks are read once


@pytest.mark.parametrize("overrides,extra", [
    ((), set()),
    (("algorithm.ppo_epochs=2", "algorithm.recompute_proximal=true"), {"proximal"}),
])
def test_the_parts_sum_to_the_step_time(tiny_model, overrides, extra):
    init_gloo()
    runner = step_runner(tiny_model, "trainer.skip_zero_advantage=false", *overrides,
                         checkpointing=True)
    batch = make_batch(plain_model(tiny_model), groups=2, group_size=2, seed=3)
    runner.train(batch)  # the first step allocates AdamW's state
    out = runner.train(batch)
    parts = {k[len("time/"):-len("_s")]: v for k,
             v in out.items() if k.startswith("time/") and k != "time/step_s"}
    assert set(parts) == STEP_PARTS | extra
    assert all(v > 0 for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(out["time/step_s"], rel=0.05)

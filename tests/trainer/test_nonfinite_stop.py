"""trainer.max_nonfinite_steps: a run whose gradient norm is not finite step after step stops,
named, instead of skipping every optimizer step for the rest of its steps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from areal_cli.config.schema import TrainerConfig
from areal_cli.trainer.main import Trainer, nonfinite_streak

NAN, OK = {"grad_norm": float("nan")}, {"grad_norm": 0.5}


def trainer(**cfg) -> Trainer:
    t = Trainer.__new__(Trainer)  # the step loop's state only: no run directory, no processes
    t.cfg = SimpleNamespace(trainer=TrainerConfig(**cfg))
    t.runner = SimpleNamespace(nonfinite=["model.layers.0.self_attn.q_proj.lora_A.default.weight"])
    t.nonfinite_streak = 0
    return t


def test_the_run_stops_after_the_limit_of_nonfinite_steps_in_a_row():
    t = trainer(max_nonfinite_steps=3)
    for step, m in enumerate([NAN, NAN, OK, NAN, NAN]):  # a finite step starts the count again
        t._stop_on_nonfinite(step, m)
    with pytest.raises(RuntimeError, match=r"steps 3-5: the gradient norm was not finite in 3 "
                                           r"steps in a "
                                           r"row.*q_proj.lora_A.*trainer.detect_anomaly=true"):
        t._stop_on_nonfinite(5, NAN)


def test_zero_never_stops_and_float16_does_not_count():
    t = trainer(max_nonfinite_steps=0)
    for step in range(20):
        t._stop_on_nonfinite(step, NAN)
    half = TrainerConfig(dtype="float16")
    assert nonfinite_streak(7, NAN, half) == 0  # its loss scale halves through overflows
    assert nonfinite_streak(7, NAN, TrainerConfig()) == 8 and nonfinite_streak(7, OK,
                                                                               TrainerConfig()) == 0

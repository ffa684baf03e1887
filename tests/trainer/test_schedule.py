"""The learning-rate schedule: warm-up, then constant or a decay that ends at min_lr_ratio × lr on
the run's last step; and the rate the real StepRunner's optimizer uses step by step."""

from __future__ import annotations

import math

import pytest
from helpers import init_gloo, make_batch, step_runner

from areal_cli.config.choices import LrDecay
from areal_cli.trainer.schedule import lr_factor


@pytest.fixture(scope="module", autouse=True)
def gloo():
    init_gloo()


def test_constant_with_warmup():
    assert [lr_factor(s, 10, warmup=4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [lr_factor(s, 10) for s in range(10)] == [1.0] * 10


@pytest.mark.parametrize("decay", [LrDecay.linear, LrDecay.cosine])
@pytest.mark.parametrize("warmup", [0, 3])
def test_decay_starts_full_and_ends_at_min_ratio(decay, warmup):
    steps = 20
    f = [lr_factor(s, steps, warmup, decay, min_ratio=0.1) for s in range(steps)]
    top = max(warmup, 1) - 1
    assert f[top] == pytest.approx(1.0)
    assert f[-1] == pytest.approx(0.1)
    # never rises after warm-up
    assert all(a >= b for a, b in zip(f[top:], f[top + 1:], strict=False))
    mid = top + (steps - 1 - top) / 2
    if float(mid).is_integer():  # halfway down: both decays sit at the middle of 1 and 0.1
        assert f[int(mid)] == pytest.approx(0.55)
    # past the end: stays
    assert lr_factor(steps + 5, steps, warmup, decay, 0.1) == pytest.approx(0.1)


def test_cosine_shape():
    # 0-based step s of 5 decays over 4 intervals: 1, (1+cos(π/4))/2, 1/2, (1-cos(π/4))/2, 0
    got = [lr_factor(s, 5, decay=LrDecay.cosine) for s in range(5)]
    c = math.cos(math.pi / 4)
    assert got == pytest.approx([1.0, (1 + c) / 2, 0.5, (1 - c) / 2, 0.0])


@pytest.mark.parametrize("steps, epochs, logged", [
    (3, 1, [1e-3, 0.6e-3, 0.2e-3]),  # 3 optimizer steps over 2 intervals: 1, 0.6, 0.2
    (2, 2, [1e-3, 0.4e-3]),  # 2 steps x 2 PPO epochs = 4 optimizer steps: 1, 0.8, 0.4, 0.2
])
def test_step_runner_decays_over_every_optimizer_step(tiny_model, steps, epochs, logged):
    # real optimizer steps of a cosine-decayed run: each step logs the rate of its first epoch,
    # and after the run's last optimizer step the rate is at the floor
    r = step_runner(tiny_model, "trainer.lr=1e-3", f"trainer.steps={steps}",
                    "trainer.lr_decay=cosine",
                    "trainer.min_lr_ratio=0.2", f"algorithm.ppo_epochs={epochs}")
    lrs = [r.train(make_batch(r.model, 2, 2, seed=k))["lr"] for k in range(steps)]
    assert lrs == pytest.approx(logged)
    assert r.sched.get_last_lr()[0] == pytest.approx(0.2e-3)

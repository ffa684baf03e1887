"""Advantages of agent episodes that span several trajectories (rows): the group estimators compare
episodes, and each row takes its episode's advantage. Expected numbers derived by hand."""

from __future__ import annotations

import torch

from areal_cli.config.algorithm import AlgorithmConfig
from areal_cli.trainer.advantages import compute_advantages
from areal_cli.trainer.batching import shard


def _adv(rewards, episodes, estimator="dr_grpo", group_size=2):
    r = torch.tensor(rewards, dtype=torch.float64)
    mask = torch.ones(len(rewards), 3, dtype=torch.bool)
    adv, _ = compute_advantages(r, mask, AlgorithmConfig(adv_estimator=estimator),
                                group_size=group_size,
                                episodes=None if episodes is None else torch.tensor(episodes))
    return adv[:, 0].tolist()


def test_episodes_are_compared_not_rows():
    # group of 2 episodes: episode 0 = rows 0, 1 (reward 1), episode 1 = row 2 (reward 0).
    # dr_grpo: mean over episodes = 0.5, so episode 0 gets +0.5 and episode 1 gets -0.5; counting
    # rows instead would give a mean of 2/3.
    assert _adv([1.0, 1.0, 0.0], [0, 0, 1]) == [0.5, 0.5, -0.5]
    # two groups: (e0: rows 0-2, 1.0; e1: row 3, 0.0) and (e2: row 4, 0.0; e3: rows 5-6, 0.0)
    assert _adv([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], [0, 0, 0, 1, 2, 3, 3]) == [0.5, 0.5, 0.5, -0.5,
                                                                                0, 0, 0]


def test_grpo_over_episodes():
    # episodes' rewards [1, 0]: mean 0.5, population std 0.5 → (1 - 0.5) / (0.5 + 1e-6)
    a = 0.5 / (0.5 + 1e-6)
    got = _adv([1.0, 1.0, 0.0], [0, 0, 1], estimator="grpo")
    assert all(abs(x - y) < 1e-12 for x, y in zip(got, [a, a, -a], strict=True))


def test_one_episode_per_row_is_unchanged():
    assert _adv([1.0, 0.0, 1.0, 1.0], None) == _adv([1.0, 0.0, 1.0, 1.0], [0, 1, 2, 3]) == [0.5,
                                                                                            -0.5, 0,
                                                                                            0]


def test_rows_that_do_not_divide_over_ranks_are_all_assigned_once():
    for n in range(0, 12):
        for world in (1, 2, 3, 4):
            rows = [i for r in range(world) for i in shard(n, r, world)]
            assert rows == list(range(n))
            sizes = [len(shard(n, r, world)) for r in range(world)]
            assert max(sizes) - min(sizes) <= 1

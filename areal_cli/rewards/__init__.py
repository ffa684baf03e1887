"""Rewards: answer extraction, math and code scorers, the sandbox, and the reward pool."""

from areal_cli.rewards.pool import RewardPool, RewardResult
from areal_cli.rewards.scoring import score

__all__ = ["RewardPool", "RewardResult", "score"]

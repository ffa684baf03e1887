"""workflow=multi_turn: a wrong answer gets feedback ("wrong, try again") and another turn, up to
``workflow.max_turns``; the reward is discounted by ``workflow.turn_discount`` per extra turn."""

from __future__ import annotations

from areal_cli.workflows.turns import Episode, Group, TurnWorkflow


class MultiTurn(TurnWorkflow):
    """Feedback after every answer that scores below 1, until one is right or the turns run out."""

    def next_message(self, group: Group, ep: Episode, score: float) -> str | None:
        if score < 1.0 and ep.turns < self.cfg.max_turns:
            return self.cfg.feedback
        return None

    def final_reward(self, ep: Episode, score: float) -> float:
        return float(score) * self.cfg.turn_discount ** (ep.turns - 1)


WORKFLOW = MultiTurn

"""workflow=single_turn: one answer, one reward (the turn loop's defaults)."""

from areal_cli.workflows.turns import TurnWorkflow


class SingleTurn(TurnWorkflow):
    """One model turn per episode, scored by the task's reward."""


WORKFLOW = SingleTurn

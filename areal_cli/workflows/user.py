"""workflow.name=module:function — a user workflow: after every model turn and its reward, areal
calls ``function(completion: str, turn: int, problem: Problem, reward: float) -> str | None``; a
string is the next user message (up to ``workflow.max_turns``), None ends the episode with that
reward. Keep it fast and pure; it runs inside the rollout worker (examples/hint_workflow.py)."""

from __future__ import annotations

from areal_cli.config.schema import WorkflowConfig
from areal_cli.engines.base import Engine
from areal_cli.user_code import load_callable
from areal_cli.workflows.length_profile import LengthProfile
from areal_cli.workflows.turns import Episode, Group, TurnWorkflow


class UserWorkflow(TurnWorkflow):
    """The turn loop, asking the user's function for each next message."""

    def __init__(self, cfg: WorkflowConfig, engine: Engine, rewards, tokenizer, worker: int,
                 lengths: LengthProfile | None = None):
        super().__init__(cfg, engine, rewards, tokenizer, worker, lengths)
        self.user_fn = import_workflow(cfg.name)

    def next_message(self, group: Group, ep: Episode, score: float) -> str | None:
        if ep.turns < self.cfg.max_turns:
            message = self.user_fn(ep.text, ep.turns, group.problem, float(score))
            if message is not None:
                return str(message)
        return None


def import_workflow(spec: str):
    """``module:function`` → the user's function; a ValueError naming what is missing."""
    return load_callable(spec, "workflow", "(completion, turn, problem, reward) -> str | None")


WORKFLOW = UserWorkflow

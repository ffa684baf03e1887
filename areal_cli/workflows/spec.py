"""What a workflow declares about itself, and the one place the rest of areal reads it from.

Code outside ``workflows/`` never tests a workflow's name: it asks ``workflow_spec(name)`` (the
registry, ``workflows/__init__.py``) what it needs to know. The specs are a table here rather than
attributes of each ``WORKFLOW`` class so that reading one imports no workflow (the agent's brings a
web server): configs validate with them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkflowSpec:
    """What the config checks, the launcher, the controller and ``areal eval`` ask of a workflow."""

    runs_code: bool = False
    """Runs model-written code itself (not only in a reward), so it needs a working
    ``reward.sandbox``."""
    runs_agent: bool = False
    """Runs the user's async agent that ``workflow.agent`` names; its groups carry episode
    counters."""
    varying_rows: bool = False
    """A group's episodes become any number of trajectories, so a batch has no fixed row count to
    split over the trainer's ranks."""
    in_eval: bool = False
    """``areal eval`` can evaluate a model with it."""


SPECS: dict[str, WorkflowSpec] = {
    "single_turn": WorkflowSpec(in_eval=True),
    "multi_turn": WorkflowSpec(),
    "tool_use": WorkflowSpec(runs_code=True),
    "agent": WorkflowSpec(runs_agent=True, varying_rows=True, in_eval=True),
}
"""The built-in workflows' specs by name; a ``module:function`` workflow (``user.py``) and any
other name have the defaults."""

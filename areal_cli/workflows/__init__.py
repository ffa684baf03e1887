"""The workflows: how a prompt group becomes trajectories (``base.Workflow`` is the interface).

One module per built-in workflow, each defining ``WORKFLOW``: ``single_turn.py``, ``multi_turn.py``
and ``tool_use.py`` on the turn loop they share (``turns.py``), ``user.py`` for a user's
``module:function``, and the ``agent/`` package (the OpenAI-compatible endpoint a user's agent
calls; its ``WORKFLOW`` is in ``agent/workflow.py``). ``workflow_class(name)`` is the registry: the
module of that name (or its package's ``workflow.py``), so adding a workflow is one module here and,
where it differs from the defaults, its line in ``spec.SPECS``. The rest of areal asks
``workflow_spec(name)``, never the name. Importing this module imports no workflow.
"""

from __future__ import annotations

import importlib
import importlib.util

from areal_cli.workflows.spec import SPECS, WorkflowSpec

USER = "user"
"""The module of a ``module:function`` workflow."""


def workflow_class(name: str) -> type:
    """The ``WORKFLOW`` class of ``workflow.name=name``; ValueError where no module of that name has
    one."""
    base = USER if ":" in name else name
    module = f"{__name__}.{base}"
    if base.isidentifier() and importlib.util.find_spec(module) is not None:
        found = importlib.import_module(module)
        if found.__spec__.submodule_search_locations is not None:  # a package: its workflow.py
            found = importlib.import_module(f"{module}.workflow")
        if "WORKFLOW" in vars(found):
            return found.WORKFLOW
    raise ValueError(f"workflow={name!r}: no module areal_cli/workflows/{name}.py (or package) "
                     "defining WORKFLOW; use single_turn, multi_turn, tool_use, agent or "
                     "module:function")


def workflow_spec(name: str) -> WorkflowSpec:
    """What ``workflow.name=name`` declares (``spec.py``); the defaults for a ``module:function``
    workflow, and for a name no module defines (``workflow_class`` reports that one)."""
    return SPECS.get(name, WorkflowSpec())

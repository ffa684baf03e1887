"""The workflow interface: what a rollout worker calls (``rollout/main.py``), and the evaluator for
workflow=agent (``eval/agent.py``).

A workflow turns each admitted prompt group (``WorkItem``) into trajectories: it submits model turns
to the engine, hears each finished turn, scores, adds turns (feedback, tool output, an agent's next
call) and returns the finished group (``GroupResult``). The worker drives it from one thread:

    flow = WORKFLOW.from_run(cfg, engine, rewards, tokenizer, index, run_dir)
    flow.start(item)                 # a group admitted by the controller
    flow.on_generated(seq)           # every sequence the engine finished
    for result in flow.poll(): ...   # groups now complete, sent to the controller
    flow.drop_stale(oldest)          # after a weight update or StaleBefore (areal_cli/staleness.py)
    flow.busy()                      # groups in flight (the worker's capacity)
    flow.close()                     # the worker stops

Adding a workflow is one module ``workflows/<name>.py`` (or a package whose ``workflow.py``) that
defines ``WORKFLOW``, a class with these methods; ``workflow=<name>`` (a
``conf/workflow/<name>.yaml`` for the Hydra group, or ``workflow.name=<name>``) selects it
(``workflows.workflow_class``).
"""

from __future__ import annotations

from typing import Protocol

from areal_cli.config.schema import RootConfig
from areal_cli.engines.base import Engine, Sequence
from areal_cli.transport.messages import GroupResult, WorkItem


class Workflow(Protocol):
    """The methods a rollout worker calls on its workflow, typed."""

    @classmethod
    def from_run(cls, cfg: RootConfig, engine: Engine, rewards, tokenizer, worker: int,
                 run_dir: str | None) -> Workflow:
        """The workflow of rollout worker ``worker`` of a run with config ``cfg``, generating with
        ``engine`` and scoring with ``rewards`` (the reward pool or client); ``run_dir`` = None
        outside a run directory."""
        ...

    def start(self, item: WorkItem) -> None:
        """Begin the group ``item``: submit its first model turns."""
        ...

    def on_generated(self, seq: Sequence) -> None:
        """A sequence this workflow submitted has finished (``seq.rid`` is its own id)."""
        ...

    def poll(self) -> list[GroupResult]:
        """Advance what finished meanwhile (rewards, tools, agents); the groups now complete."""
        ...

    def busy(self) -> int:
        """Groups started and not yet returned."""
        ...

    def drop_stale(self, oldest: int) -> list[GroupResult]:
        """Stop the groups whose first model token is older than version ``oldest``; each comes back
        as a ``stale`` result without samples ([] for a workflow whose groups always run to their
        end)."""
        ...

    def close(self) -> None:
        """Stop: free what the workflow holds (threads, servers)."""
        ...

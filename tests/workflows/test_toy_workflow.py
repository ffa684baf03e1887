"""Adding a workflow is one module under workflows/ defining WORKFLOW, and no edit anywhere else: a
toy workflow written into a directory of its own is found by name, built by the rollout worker's
``make_workflow`` and driven through the ``Workflow`` methods the worker calls."""

from __future__ import annotations

import logging
import sys
import textwrap
import types

import numpy as np
import pytest

import areal_cli.workflows
from areal_cli.config.schema import RootConfig
from areal_cli.rollout.main import Worker, make_workflow
from areal_cli.transport.messages import WorkItem
from areal_cli.workflows import workflow_class, workflow_spec
from areal_cli.workflows.spec import SPECS, WorkflowSpec

TOY = '''
import time

from areal_cli.transport.messages import GroupResult


class ToyFlow:
    """Every group is complete at once, without samples; stale from version 5 on."""

    def __init__(self, worker):
        self.worker, self.started, self.closed = worker, [], False

    @classmethod
    def from_run(cls, cfg, engine, rewards, tokenizer, worker, run_dir):
        return cls(worker)

    def start(self, item):
        self.started.append(item)

    def on_generated(self, seq):
        pass

    def poll(self):
        out = [GroupResult(i.group_id, i.prompt_id, self.worker, [], 0.0, 0) for i in self.started]
        self.started = []
        return out

    def busy(self):
        return len(self.started)

    def drop_stale(self, oldest):
        return [GroupResult(99, "p", self.worker, [], 0.0, 0, stale=True)] if oldest >= 5 else []

    def close(self):
        self.closed = True


WORKFLOW = ToyFlow
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """workflows/toy_flow.py in a directory of its own, on the workflows package's path."""
    (tmp_path / "toy_flow.py").write_text(textwrap.dedent(TOY))
    monkeypatch.setattr(areal_cli.workflows, "__path__",
                        [*areal_cli.workflows.__path__, str(tmp_path)])
    yield "toy_flow"
    sys.modules.pop("areal_cli.workflows.toy_flow", None)


def test_a_toy_workflow_is_found_built_and_driven_by_the_worker(toy):
    cfg = RootConfig()
    cfg.workflow.name = toy
    flow = make_workflow(cfg, engine=None, pool=None, tok=None, index=3, run_dir=None)
    assert type(flow) is workflow_class(toy) and flow.worker == 3
    flow.start(WorkItem(0, "p", np.zeros(0, np.int32), 1, 8, {}, 0))
    assert flow.busy() == 1 and [(r.group_id, r.worker) for r in flow.poll()] == [(0, 3)]
    # the worker's staleness bound and its close call the workflow's own methods
    w = Worker.__new__(Worker)
    sent = []
    w.flow, w.results, w.log = (flow, types.SimpleNamespace(send=sent.append),
                                logging.getLogger("toy"))
    w.cfg = types.SimpleNamespace(rollout=types.SimpleNamespace(max_staleness=2))
    w.engine, w.pool = (types.SimpleNamespace(close=lambda: None),
                        types.SimpleNamespace(close=lambda: None))
    w._drop_stale(4)
    w._drop_stale(5)
    assert [r.group_id for r in sent] == [99] and sent[0].stale
    w.close()
    assert flow.closed


def test_a_name_without_its_module_is_a_value_error():
    with pytest.raises(ValueError, match="workflow='toy_flow': no module"):
        workflow_class("toy_flow")
    with pytest.raises(ValueError, match="no module"):
        workflow_class("turns")  # the shared loop defines no WORKFLOW of its own
    assert workflow_class("single_turn").__name__ == "SingleTurn"
    assert workflow_class("tests.examples:hint").__name__ == "UserWorkflow"


def test_every_spec_names_a_workflow_and_others_get_the_defaults():
    """What the config checks, the controller and areal eval ask of a workflow: a spec for each
    built-in (a misspelt key would silently give the defaults), the defaults for the rest."""
    for name in SPECS:
        assert workflow_class(name).__name__
    assert workflow_spec("tool_use").runs_code
    assert workflow_spec("agent").runs_agent and workflow_spec("agent").varying_rows
    assert [n for n in SPECS if workflow_spec(n).in_eval] == ["single_turn", "agent"]
    assert workflow_spec("tests.examples:hint") == workflow_spec("toy_flow") == WorkflowSpec()

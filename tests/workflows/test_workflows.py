"""Multi-turn and tool-use episodes on the real engine, reward pool and sandbox: the tokens
the trainer will see, their loss mask, behaviour logprobs and versions stay aligned."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import drive_workflow, hf_engine
from transformers import AutoTokenizer

from areal_cli.config.schema import WorkflowConfig
from areal_cli.config.task import RewardConfig, TaskConfig
from areal_cli.engines.base import Sequence
from areal_cli.rewards import RewardPool
from areal_cli.tasks import Problem, prompt_ids
from areal_cli.transport.messages import WorkItem
from areal_cli.workflows import workflow_class
from areal_cli.workflows.turns import Episode, Group, TurnId


def _run(tiny_model, cfg: WorkflowConfig, inject=None, reward=None):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    eng = hf_engine(tiny_model)
    pool = RewardPool(reward or RewardConfig(fn="exact", timeout_s=5.0), 1)
    flow = workflow_class(cfg.name)(cfg, eng, pool, tok, worker=0)
    problem = Problem("t/1", "What is 2 + 3?", "5", {})
    prompt = prompt_ids(tok, problem, TaskConfig())
    item = WorkItem(0, "t/1", np.asarray(prompt, np.int32), 2, 8, problem.to_dict(), 0)
    if inject is None:
        flow.start(item)
    else:  # the first turn's text is given (as if generated); later turns are generated
        flow.groups[0] = Group(item, problem, [Episode(i, list(prompt)) for i in range(2)],
                               time.monotonic())
        ids = tok(inject, add_special_tokens=False)["input_ids"] + [2]
        for i in range(2):
            flow.on_generated(Sequence(TurnId(0, i, 0), prompt, 64, ids, [-1.0] * len(ids),
                                       [0] * len(ids),
                                       "stop"))
    results = drive_workflow(flow, eng, 60)
    eng.close()
    pool.close()
    assert results, "the group never completed"
    return tok, results[0]


def _check_alignment(sample):
    n = len(sample.output_ids)
    assert len(sample.logprobs) == len(sample.versions) == len(sample.loss_mask) == n
    env = sample.loss_mask == 0
    assert np.all(sample.versions[env] == -1) and np.all(sample.logprobs[env] == 0.0)
    assert np.all(sample.versions[~env] >= 0) and np.all(sample.logprobs[~env] < 0)


def test_multi_turn_masks_feedback_and_keeps_alignment(tiny_model):
    cfg = WorkflowConfig(name="multi_turn", max_turns=2, feedback="Wrong, try again.")
    tok, group = _run(tiny_model, cfg)
    for s in group.samples:
        _check_alignment(s)
        if s.num_turns == 2:  # a random model is wrong: it got feedback and a second turn
            env_text = tok.decode(s.output_ids[s.loss_mask == 0])
            assert "Wrong, try again." in env_text and "assistant" in env_text
            assert s.loss_mask[-1] == 1, "the episode ends on a model turn"
    assert any(s.num_turns == 2 for s in group.samples)


@pytest.mark.xdist_group("sandbox")  # see tests/rewards/test_sandbox_escapes.py
def test_tool_use_runs_code_in_the_sandbox_and_shows_the_output(tiny_model):
    cfg = WorkflowConfig(name="tool_use", max_turns=2)
    tok, group = _run(tiny_model, cfg, inject="```python\nprint(6 * 7)\n```")
    for s in group.samples:
        assert s.num_turns == 2
        env_text = tok.decode(s.output_ids[s.loss_mask == 0])
        assert "Output:" in env_text and "42" in env_text
        model = s.loss_mask == 1
        assert model.sum() > 0 and s.loss_mask[-1] == 1


@pytest.mark.xdist_group("sandbox")  # see tests/rewards/test_sandbox_escapes.py
def test_tool_use_runs_under_the_reward_code_limits(tiny_model):
    reward = RewardConfig(fn="exact", timeout_s=5.0, code_wall_s=1.0, code_cpu_s=1)
    t0 = time.monotonic()
    tok, group = _run(tiny_model, WorkflowConfig(name="tool_use", max_turns=2),
                      inject="```python\nimport time\ntime.sleep(30)\n```", reward=reward)
    for s in group.samples:  # killed at reward.code_wall_s=1, not at a built-in 8 s
        assert "wall time 1.0s exceeded" in tok.decode(s.output_ids[s.loss_mask == 0])
    assert time.monotonic() - t0 < 30

"""The config checks that depend on the workflow ask its spec (``workflows.workflow_spec``): the
agent's own key, the batch split that agent rows are exempt from, and the workflows ``areal eval``
can run."""

from __future__ import annotations

from areal_cli.config.schema import RootConfig
from areal_cli.eval.config import EvalRunConfig
from areal_cli.runconfig.compose import validate


def test_the_agent_workflow_and_its_agent_come_together():
    cfg = RootConfig()
    cfg.workflow.name = "agent"
    assert validate(cfg) == ["workflow=agent needs workflow.agent=module:function (got ''): "
                             "run(client, problem) -> float | dict | None, async or not "
                             "(examples/agents/); or workflow.agent_cmd='<command>', a program "
                             "run per episode"]
    cfg.workflow.name, cfg.workflow.agent = "multi_turn", "m:f"
    assert validate(cfg) == ["workflow.agent=m:f is set but workflow=multi_turn: add "
                             "workflow=agent"]
    cfg.workflow.name = "agent"
    assert validate(cfg) == []


def test_an_agent_is_a_function_or_a_program_never_both():
    cfg = RootConfig()
    w = cfg.workflow
    w.name, w.agent, w.agent_cmd = "agent", "m:f", "./run.sh"
    assert validate(cfg) == ["workflow.agent=m:f and workflow.agent_cmd='./run.sh' are both set: "
                             "keep one (a Python function, or a program run per episode)"]
    w.agent, w.agent_reward = "", "verifier"
    assert validate(cfg) == ["workflow.agent_reward=verifier with workflow.agent_verifier_cmd='': "
                             "a verifier command goes with agent_reward=verifier, and only with "
                             "it"]
    w.agent_verifier_cmd = "./check.sh"
    assert validate(cfg) == []
    w.agent, w.agent_cmd = "m:f", ""
    assert validate(cfg) == [
        f"workflow.{k}={v} applies to workflow.agent_cmd only; a Python agent returns its reward"
        for k, v in (("agent_verifier_cmd", "./check.sh"), ("agent_reward", "verifier"))]
    w.name, w.agent, w.agent_verifier_cmd, w.agent_reward = "multi_turn", "", "", "task"
    w.agent_cmd = "./run.sh"
    assert validate(cfg) == ["workflow.agent_cmd=./run.sh is set but workflow=multi_turn: add "
                             "workflow=agent"]


def test_only_a_workflow_of_fixed_rows_must_split_evenly_over_the_ranks():
    cfg = RootConfig()
    cfg.trainer.ranks, cfg.trainer.batch_size, cfg.rollout.group_size = 3, 4, 4  # 16 rows
    assert validate(cfg) == ["trainer.batch_size × rollout.group_size = 16 samples do not split "
                             "evenly over trainer.ranks=3: choose a batch_size or ranks that "
                             "divides it"]
    cfg.workflow.name, cfg.workflow.agent = "agent", "m:f"
    assert validate(cfg) == []


def test_areal_eval_runs_single_turn_or_a_greedy_agent():
    cfg = EvalRunConfig()
    assert cfg.validate() == []
    cfg.workflow.name = "multi_turn"
    assert cfg.validate() == ["workflow=multi_turn: areal eval runs single_turn or agent"]
    cfg.workflow.name = "agent"
    assert cfg.validate() == ["workflow=agent needs workflow.agent=module:function (got ''): "
                              "run(client, problem) -> float | dict | None, async or not "
                              "(examples/agents/); or workflow.agent_cmd='<command>', a program "
                              "run per episode"]
    cfg.workflow.agent, cfg.temperature = "m:f", 0.7
    assert cfg.validate() == ["workflow=agent is evaluated greedily in one process: drop "
                              "temperature, gpus and workers"]

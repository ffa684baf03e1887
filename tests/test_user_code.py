"""load_callable: a user's ``module:function`` from the config, or one ValueError naming the key,
what is wrong and the fix."""

from __future__ import annotations

import uuid

import pytest

from areal_cli.rewards.scoring import import_custom
from areal_cli.user_code import load_callable
from areal_cli.workflows.agent.episode import import_agent
from areal_cli.workflows.user import import_workflow

USER_MODULE = """
LIMIT = 3

def plain(completion, problem):
    return 1.0

async def agent(client, problem):
    return 1.0
"""


@pytest.fixture
def module(tmp_path, monkeypatch):
    name = f"areal_test_user_code_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_function_loads(module):
    fn = load_callable(f"{module}:plain", "reward.fn", "(completion, problem) -> float")
    assert fn("x", None) == 1.0
    agent = load_callable(f"{module}:agent", "workflow.agent", "(client, problem)", coroutine=True)
    assert agent.__name__ == "agent"


@pytest.mark.parametrize("spec", ["magic", ":fn", "mod:"])
def test_a_value_that_is_no_import_path_names_the_form(spec):
    with pytest.raises(ValueError, match=rf"^reward.fn='{spec}': not an import path; write it as "
                                         r"'my_module:my_fn' and define \w+\(completion\) in"):
        load_callable(spec, "reward.fn", "(completion)")


def test_a_module_that_does_not_import_names_pythonpath():
    with pytest.raises(ValueError, match=r"^workflow='no_such_mod_xyz:f': cannot import module "
                                         r"'no_such_mod_xyz' \(.*\); put it on PYTHONPATH"):
        load_callable("no_such_mod_xyz:f", "workflow", "(completion)")


def test_a_missing_attribute_names_the_function_to_define(module):
    with pytest.raises(ValueError, match=rf"^workflow.agent='{module}:nope': module '{module}' has "
                                         r"no function 'nope'; define async def nope\(client\) "
                                         "there"):
        load_callable(f"{module}:nope", "workflow.agent", "(client)", coroutine=True)


def test_an_attribute_that_is_no_function_is_named_with_its_type(module):
    with pytest.raises(ValueError, match=rf"{module}.LIMIT is not a function \(its type is int\); "
                                         r"define LIMIT\(completion\)"):
        load_callable(f"{module}:LIMIT", "reward.fn", "(completion)")


def test_an_agent_may_be_async_or_plain(module):
    """A plain function is a synchronous agent (run in threads: workflows/agent/runners.py)."""
    assert import_agent(f"{module}:plain").__name__ == "plain"
    assert import_agent(f"{module}:agent").__name__ == "agent"


def test_each_caller_names_its_own_key_and_signature(module):
    """The three config keys that take a ``module:function`` each name themselves and the
    signature areal calls."""
    with pytest.raises(ValueError, match=r"^reward.fn=.*define nope\(completion: str, problem: "
                                         r"Problem\) -> float"):
        import_custom(f"{module}:nope")
    with pytest.raises(ValueError, match=r"^workflow=.*define nope\(completion, turn, problem, "
                                         r"reward\) -> str \| None"):
        import_workflow(f"{module}:nope")
    with pytest.raises(ValueError, match=r"^workflow.agent=.*define nope\(client, problem\)"):
        import_agent(f"{module}:nope")

"""Tasks by name through the real CLI: `areal tasks`, and `areal train task=reasoning_gym
task.dataset=<any> task.params.<key>=<value> --dry-run` (Typer's CliRunner, in process)."""

import re
import textwrap

import pytest
import yaml
from typer.testing import CliRunner

from areal_cli.cli import app
from areal_cli.runconfig.compose import compose
from areal_cli.tasks import load_split

runner = CliRunner()


def areal(*args: str):
    return runner.invoke(app, list(args))


def task_of(output: str) -> dict:
    """The `task:` block of the resolved config that --dry-run prints."""
    block = re.search(r"^task:\n((?:  .*\n)+)", output, re.MULTILINE)
    assert block, output[-2000:]
    return yaml.safe_load(textwrap.dedent(block.group(1)))


def test_areal_tasks_lists_presets_and_datasets():
    result = areal("tasks")
    assert result.exit_code == 0, result.output
    assert re.search(r"^  basic_arithmetic +The default task", result.output, re.MULTILINE)
    assert re.search(r"^  reasoning_gym +Any reasoning-gym dataset by name", result.output, re.MULTILINE)
    assert "reasoning-gym datasets (" in result.output
    for name in ("leg_counting", "gsm_symbolic", "zebra_puzzles"):
        assert f"  {name}" in result.output


def test_areal_tasks_shows_a_datasets_params_and_names_the_valid_ones():
    result = areal("tasks", "leg_counting")
    assert result.exit_code == 0, result.output
    assert re.search(r"^  max_animals +10$", result.output, re.MULTILINE)
    bad = areal("tasks", "leg_count")
    assert bad.exit_code == 2
    assert "did you mean leg_counting" in bad.output and "zebra_puzzles" in bad.output


def test_any_dataset_by_name_with_params():
    result = areal("train", "task=reasoning_gym", "task.dataset=leg_counting", "task.params.max_animals=4",
                   "--dry-run")
    assert result.exit_code == 0, result.output
    task = task_of(result.output)
    assert (task["name"], task["dataset"], task["params"]) == ("leg_counting", "leg_counting", {"max_animals": 4})
    assert task["instruction"] == "Give your final answer on the last line as 'Answer: <answer>'."


def test_switching_dataset_drops_the_presets_params():
    preset_params = task_of(areal("train", "--dry-run").output)["params"]
    assert "min_terms" in preset_params  # the default preset's own
    switched = task_of(areal("train", "task.dataset=chain_sum", "--dry-run").output)
    assert (switched["name"], switched["params"]) == ("chain_sum", {})
    given = task_of(areal("train", "task.dataset=chain_sum", "task.params.max_terms=3", "--dry-run").output)
    assert given["params"] == {"max_terms": 3}


def test_params_added_to_or_replacing_the_presets():
    added = task_of(areal("train", "task.params.allow_negation=false", "--dry-run").output)["params"]
    assert added["allow_negation"] is False and "min_terms" in added  # a key the preset lacks
    whole = task_of(areal("train", "task.params={min_terms:2,max_terms:3}", "--dry-run").output)["params"]
    assert whole == {"min_terms": 2, "max_terms": 3}  # a whole dict replaces the preset's


@pytest.mark.parametrize(("args", "names"), [
    (["task.dataset=leg_countin"], ["did you mean leg_counting", "zebra_puzzles"]),
    (["task.params.nonsense=1"], ["task.params.nonsense is not an option", "max_animals", "min_instances"]),
    (["task.params.min_animals=9", "task.params.max_animals=3"], ["rejected by reasoning-gym 'leg_counting'"]),
    ([], ["task.dataset is empty", "areal tasks"]),
])
def test_bad_dataset_or_param_exits_2_naming_the_valid_ones(args, names):
    dataset = [] if not args or args[0].startswith("task.dataset") else ["task.dataset=leg_counting"]
    result = areal("train", "task=reasoning_gym", *dataset, *args, "--dry-run")
    assert result.exit_code == 2, result.output
    for name in names:
        assert name in result.output


@pytest.mark.parametrize("dataset", ["leg_counting", "spell_backward", "rotate_matrix", "gcd"])
def test_reasoning_gym_preset_builds_splits(dataset):
    cfg = compose(["task=reasoning_gym", f"task.dataset={dataset}", "task.size=20", "task.eval_size=5"]).task
    train, held = load_split(cfg, "train"), load_split(cfg, "eval")
    assert len(train.problems) == 20 and len(held.problems) == 5
    assert {p.key for p in train.problems}.isdisjoint(p.key for p in held.problems)


@pytest.mark.slow
def test_every_reasoning_gym_dataset_works_by_name():
    """~70 s on a 2-core CPU. `composite` combines other datasets and needs task.params.datasets."""
    from reasoning_gym.factory import DATASETS

    for dataset in sorted(set(DATASETS) - {"composite"}):
        cfg = compose(["task=reasoning_gym", f"task.dataset={dataset}", "task.size=4", "task.eval_size=2"]).task
        train, held = load_split(cfg, "train"), load_split(cfg, "eval")
        assert {p.key for p in train.problems}.isdisjoint(p.key for p in held.problems), dataset

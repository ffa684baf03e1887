"""reasoning-gym and HumanEval task sources, and the task presets in conf/task/."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from areal_cli.config.task import RewardConfig, TaskConfig
from areal_cli.tasks import build_messages, load_problems

CONF = Path(__file__).resolve().parents[2] / "conf"


def preset(name: str) -> TaskConfig:
    path = CONF / "task" / f"{name}.yaml"
    assert path.read_text().startswith("# @package task")
    return OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(TaskConfig), OmegaConf.load(path))
    )


def test_default_task_is_two_terms_of_one_or_two_digits_plus_minus():
    cfg = preset("basic_arithmetic")
    cfg.size, cfg.eval_size = 200, 20
    train, ev = load_problems(cfg, "train"), load_problems(cfg, "eval")
    assert len(train) == 200 and len(ev) == 20
    assert train[3].id == "basic_arithmetic/train/3" and ev[0].id == "basic_arithmetic/eval/0"
    for p in train:
        expression = p.meta["rg_entry"]["metadata"]["expression"]
        assert "*" not in expression and "/" not in expression
        terms = [t for t in expression.split() if t.isdigit()]
        # reasoning-gym: 2 digits = 0..100
        assert len(terms) == 2 and all(int(t) <= 100 for t in terms)
        assert "(" not in expression and not any(t.startswith("-") and t != "-"
                                                 for t in expression.split())
        assert p.prompt.endswith("'Answer: <number>'.")
        assert p.answer == str(eval(expression))  # the reference is the expression's value
    assert any(int(t) > 10 for p in train
               for t in p.meta["rg_entry"]["metadata"]["expression"].split()
               if t.isdigit())  # both sizes are drawn
    assert [p.prompt for p in train[:20]] != [p.prompt for p in ev]  # eval uses another seed
    assert load_problems(cfg, "train") == train  # same seed, same problems
    json.dumps([p.to_dict() for p in train])  # meta crosses the wire


def test_messages_with_and_without_system_prompt():
    cfg = TaskConfig(size=1, system_prompt="Be brief.")
    p = load_problems(cfg, "train")[0]
    assert build_messages(p, cfg) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": p.prompt},
    ]
    assert build_messages(p, TaskConfig()) == [{"role": "user", "content": p.prompt}]


def test_bad_params_and_dataset_name_name_the_fix():
    with pytest.raises(ValueError, match=r"task.params=.*Its options are: .*min_terms"):
        load_problems(TaskConfig(size=2, params={"nonsense": 1}), "train")
    assert "not a reasoning-gym dataset" in TaskConfig(dataset="basic_arith").validate()[0]
    with pytest.raises(ValueError, match="split='test'"):
        load_problems(TaskConfig(), "test")


@pytest.mark.parametrize("name", ["basic_arithmetic", "chain_sum", "gsm_symbolic", "humaneval"])
def test_presets_load_and_validate(name):
    cfg = preset(name)
    cfg.size, cfg.eval_size = (0, 4) if name == "humaneval" else (4, 4)
    assert cfg.validate() == []
    assert len(load_problems(cfg, "eval")) == 4


def test_jsonl_and_reward_presets():
    assert preset("jsonl").validate() == ["task.path is empty: set task.path=/path/to/data"]
    schema = OmegaConf.structured(RewardConfig)
    reward = OmegaConf.merge(schema, OmegaConf.load(CONF / "reward/default.yaml"))
    assert OmegaConf.to_object(reward).validate() == []


def test_humaneval_split_covers_all_164():
    cfg = TaskConfig(name="humaneval", source="humaneval", size=0, eval_size=40)
    train, ev = load_problems(cfg, "train"), load_problems(cfg, "eval")
    assert len(train) == 124 and len(ev) == 40
    assert len({p.id for p in train} | {p.id for p in ev}) == 164
    assert set(ev[0].meta) == {"code_prefix", "test", "entry_point"}


def test_reward_config_validate_names_keys():
    errors = RewardConfig(fn="magic", timeout_s=0, numeric_tol=-1).validate()
    assert errors[0].startswith("reward.fn='magic': use one of auto")
    assert any(e.startswith("reward.timeout_s=0") for e in errors)
    assert any(e.startswith("reward.numeric_tol=-1") for e in errors)
    assert RewardConfig(fn="my_mod:my_fn").validate() == []

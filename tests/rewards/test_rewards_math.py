"""Answer extraction, the math scorers and the reasoning-gym verifier."""

import pytest
from omegaconf import OmegaConf

from areal_cli.config.task import RewardConfig, TaskConfig
from areal_cli.rewards import score
from areal_cli.rewards.extract import extract_answer, extract_code
from areal_cli.rewards.math_reward import exact_score, math_verify_score, numeric_score
from areal_cli.tasks import Problem, load_problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so it is 3.\nAnswer: 7", "7"),
        ("Answer: 1\nwait, Answer: **-4**.", "-4"),
        ("answer: $12$", "12"),
        ("Answer: \\boxed{5}", "5"),
        ("blah 7", "7"),
        ("5 - 3 = 2", "2"),
        ("2 + -1 = −1", "-1"),
        ("total 1,250 apples", "1250"),
        ("Answer:\n 8", "8"),  # nothing after the marker on its line: the last number
        ("no digits here", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_code():
    assert extract_code("Here:\n```python\ndef f():\n    return 1\n```\nDone") == (
        "def f():\n    return 1\n"
    )
    assert extract_code("    return 1\n") == "    return 1\n"


EQUIVALENT = [
    ("1/2", "0.5"),
    ("0.5", "The answer is $\\frac{1}{2}$"),
    ("\\frac{1}{2}", "so \\boxed{1/2}"),
    ("0.5", "\\boxed{\\frac{1}{2}}"),
    ("5", "$5$"),
    ("5", "5 cm"),
    ("5", "The side is \\boxed{5\\text{ cm}}"),
    ("x+1", "\\boxed{1+x}"),
    ("-3", "Answer: -3"),
    ("12", "blah 12"),
]
DIFFERENT = [("5", "6"), ("1/2", "1/3"), ("2", "\\boxed{-2}"), ("5", "five"), ("3", "3 then 4")]


@pytest.mark.parametrize(("gold", "completion"), EQUIVALENT)
def test_math_verify_accepts_equivalent(gold, completion):
    assert math_verify_score(completion, gold) == 1.0


@pytest.mark.parametrize(("gold", "completion"), DIFFERENT)
def test_math_verify_rejects_different(gold, completion):
    assert math_verify_score(completion, gold) == 0.0


def test_exact_and_numeric():
    assert exact_score("Answer: Paris.", "paris") == 1.0
    assert exact_score("Answer: Lyon", "paris") == 0.0
    assert numeric_score("Answer: 0.3333333", "1/3", tol=1e-6) == 1.0  # |diff| = 3.3e-8
    assert numeric_score("Answer: 0.33", "1/3", tol=1e-6) == 0.0
    assert numeric_score("roughly 1,000.0", "1000", tol=0.0) == 1.0
    assert numeric_score("none", "1", tol=1.0) == 0.0


def test_default_task_uses_its_own_verifier():
    path = "conf/task/basic_arithmetic.yaml"
    cfg = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(TaskConfig), OmegaConf.load(path))
    )
    cfg.size = 5
    reward = RewardConfig()  # fn=auto picks reasoning_gym for these problems
    for p in load_problems(cfg, "train"):
        assert score(f"Answer: {p.answer}", p, reward) == 1.0
        assert score(f"blah {p.answer}", p, reward) == 1.0  # lenient: the last number
        wrong = str(int(p.answer) + 1)  # for -18..18 never contains the reference as text
        assert score(f"Answer: {wrong}", p, reward) == 0.0
        assert score("I don't know", p, reward) == 0.0


def test_reasoning_gym_partial_credit_is_the_datasets_own_and_opt_in():
    p = Problem("t/0", "Calculate 1 + 1.", "2", {"rg_dataset": "basic_arithmetic",
                # fmt: skip
                "rg_entry": {"question": "Calculate 1 + 1.", "answer": "2", "metadata": {}}})
    # reasoning-gym's base score_answer: the oracle inside a longer answer earns len(2)/len(12)
    assert score("Answer: 12", p, RewardConfig(fn="reasoning_gym", partial_credit=True)) == 0.5
    assert score("Answer: 12", p, RewardConfig(fn="reasoning_gym")) == 0.0
    assert score("Answer: 2.0", p, RewardConfig(fn="reasoning_gym")) == 1.0  # the same number
    with pytest.raises(ValueError, match="is not from reasoning-gym"):
        score("1", Problem("x", "q", "1", {}), RewardConfig(fn="reasoning_gym"))


def test_auto_picks_math_verify_for_file_problems():
    p = Problem("f/0", "Half of one?", "\\frac{1}{2}", {})
    assert score("It is 0.5", p, RewardConfig()) == 1.0
    assert score("It is 0.6", p, RewardConfig()) == 0.0

"""Completions that game a reward: every shipped reward fn must pay 0 for a wrong final answer.

One table, every row against every reward function (reasoning-gym's verifier on two datasets,
auto, math_verify, exact, numeric; code on the rows where a program is asked for). The last
rows are correct answers, so the table fails if a scorer pays nothing at all.
"""

import pytest

from areal_cli.config.task import RewardConfig
from areal_cli.rewards import score
from areal_cli.tasks import Problem

# the tests that start sandboxed programs share one pytest-xdist worker (make test runs
# --dist loadgroup): the leftover checks of test_sandbox_escapes see every sandbox of the host
pytestmark = pytest.mark.xdist_group("sandbox")

HUGE = 100_000

WRONG = [  # (why, completion, reference): the final answer is not the reference
    ("answer repeated after the marker", "Answer: 7 7 7 7", "7"),
    ("answer repeated into a longer number", "7777", "7"),
    ("repeated, with the marker", "Answer: 7777", "7"),
    ("reference inside a longer number", "Answer: 10", "0"),
    ("reference inside a longer number, no marker", "10", "0"),
    ("reference in the middle of a number", "Answer: 170", "7"),
    ("reference with a wrong sign", "Answer: -7", "7"),
    ("reference as a decimal fraction of it", "Answer: 0.7", "7"),
    ("many numbers, the last wrong", "1 2 3 4 5 6 7 8 9 10", "7"),
    ("many numbers after the marker", "Answer: 1 2 3 4 5 6 7 8 9", "7"),
    ("two candidates", "Answer: 7, 8", "7"),
    ("either-or", "Answer: 7 or 8", "7"),
    ("a false equation ending in the reference", "Answer: 8 = 7", "7"),
    ("correct number, then a wrong final answer", "3 + 4 = 7, so\nAnswer: 8", "7"),
    ("correct answer, then a later wrong one", "Answer: 7\nWait, no.\nAnswer: 8", "7"),
    ("two boxed answers", "\\boxed{7} or maybe \\boxed{8}", "7"),
    ("empty", "", "7"),
    ("whitespace only", "   \n\t  \n", "7"),
    ("marker with nothing after it", "Answer:", "7"),
    ("the reference before an empty marker", "I think it is 7.\nAnswer:", "7"),
    ("huge: one digit repeated", "7" * HUGE, "7"),
    ("huge: the reference spaced out after the marker", "Answer: " + "7 " * (HUGE // 2), "7"),
    ("huge: junk then a wrong answer", "x" * HUGE + "\nAnswer: 8", "7"),
    ("huge: many numbers", "1 2 " * (HUGE // 4), "7"),
    ("unicode junk", "\x00\ufffd\u202e\U0001f600 Answer: \u2603", "7"),
    ("the reference struck through", "Answer: 7\u0338", "7"),
    ("full-width digits of another number", "Answer: \uff17\uff17", "7"),
]

RIGHT = [  # (why, completion, reference): correct, and every scorer must pay 1
    ("plain", "Answer: 7", "7"),
    ("markdown and a full stop", "3 + 4 = 7.\nAnswer: **7**.", "7"),
    ("no marker: the last number", "3 + 4 makes 7", "7"),
    ("zero", "Answer: 0", "0"),
]

CODE_TEST = {"test": "assert answer() == 7", "entry_point": ""}
CODE_RIGHT = "```python\ndef answer():\n    return 7\n```"


def rg_problem(dataset: str, reference: str) -> Problem:
    entry = {"question": f"Calculate {reference} + 0.", "answer": reference,
             "metadata": {"expression": f"{reference} + 0"}}
    return Problem(f"{dataset}/0", entry["question"], reference,
                   {"rg_dataset": dataset, "rg_entry": entry})


def scorers(reference: str) -> dict:
    """name -> (problem, reward config) for every shipped reward fn but code."""
    plain = Problem("file/0", "What is it?", reference, {})
    return {
        "reasoning_gym/basic_arithmetic": (rg_problem("basic_arithmetic", reference),
                                           RewardConfig(fn="reasoning_gym")),
        "reasoning_gym/chain_sum": (rg_problem("chain_sum", reference),
                                    RewardConfig(fn="reasoning_gym")),
        "auto/reasoning_gym": (rg_problem("basic_arithmetic", reference), RewardConfig(fn="auto")),
        "auto/math_verify": (plain, RewardConfig(fn="auto")),
        "math_verify": (plain, RewardConfig(fn="math_verify")),
        "exact": (plain, RewardConfig(fn="exact")),
        "numeric": (plain, RewardConfig(fn="numeric")),
    }


@pytest.mark.parametrize(("why", "completion", "reference"), WRONG, ids=[w for w, _, _ in WRONG])
def test_wrong_final_answer_pays_nothing(why, completion, reference):
    paid = {name: score(completion, p, cfg) for name, (p, cfg) in scorers(reference).items()}
    assert paid == dict.fromkeys(paid, 0.0), why


@pytest.mark.parametrize(("why", "completion", "reference"), RIGHT, ids=[w for w, _, _ in RIGHT])
def test_correct_answer_pays_one(why, completion, reference):
    paid = {name: score(completion, p, cfg) for name, (p, cfg) in scorers(reference).items()}
    assert paid == dict.fromkeys(paid, 1.0), why


def test_code_reward_pays_only_a_passing_program():
    """The sandbox runs each completion as a program against `assert answer() == 7`."""
    problem = Problem("code/0", "Write answer() returning 7.", "", CODE_TEST)
    cfg = RewardConfig(fn="code")
    rows = [c for _, c, ref in WRONG if ref == "7" and len(c) < 1000] + ["x" * HUGE, "7" * HUGE]
    assert [score(c, problem, cfg) for c in rows] == [0.0] * len(rows)
    assert score(CODE_RIGHT, problem, RewardConfig(fn="auto")) == 1.0


def test_partial_credit_only_when_asked():
    """reasoning-gym's own graded score: "10" holds the reference "0", len 1 / len 2 = 0.5."""
    problem = rg_problem("basic_arithmetic", "0")
    assert score("Answer: 10", problem, RewardConfig(fn="reasoning_gym")) == 0.0
    assert score("Answer: 10", problem,
                 RewardConfig(fn="reasoning_gym", partial_credit=True)) == 0.5
    assert score("Answer: 0", problem, RewardConfig(fn="reasoning_gym", partial_credit=True)) == 1.0

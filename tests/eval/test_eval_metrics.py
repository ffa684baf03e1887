"""pass@k, avg@k and the summary against plain references (no model)."""

import itertools
import random

import pytest

from areal_cli.eval.metrics import k_values, mean_pass_at_k, pass_at_k, summarize
from areal_cli.eval.report import cell, columns


def brute_force_pass_at_k(rows: list[list[bool]], k: int) -> float:
    """For each problem, the fraction of all k-subsets of its n samples with a correct one."""
    per_problem = []
    for row in rows:
        subsets = list(itertools.combinations(row, k))
        per_problem.append(sum(any(s) for s in subsets) / len(subsets))
    return sum(per_problem) / len(per_problem)


@pytest.mark.parametrize("seed", range(5))
def test_pass_at_k_matches_enumerating_every_subset(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 10)
    rows = [[rng.random() < rng.random() for _ in range(n)] for _ in range(rng.randint(1, 7))]
    for k in range(1, n + 1):
        assert mean_pass_at_k(rows, k) == pytest.approx(brute_force_pass_at_k(rows, k), abs=1e-12)


def test_pass_at_k_by_hand():
    # n=4, c=1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2; pass@4 = 1.
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    # n=200, c=3, k=100: 1 - C(197,100)/C(200,100) = 1 - (100·99·98)/(200·199·198) ≈ 0.8769
    assert pass_at_k(200, 3, 100) == pytest.approx(1 - (100 * 99 * 98) / (200 * 199 * 198))
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_k_values_are_powers_of_two_then_n():
    assert k_values(1) == [1]
    assert k_values(8) == [1, 2, 4, 8]
    assert k_values(6) == [1, 2, 4, 6]


def sample(pid, kind, score, length=10, finish="stop"):
    return {"prompt_id": pid, "pass": kind, "score": score, "length": length, "finish_reason": finish}


def test_summary_of_a_greedy_and_a_sampled_pass():
    samples = [sample("a", "greedy", 1.0), sample("b", "greedy", 0.0)]
    # problem a: 2 of 4 correct; problem b: 0 of 4, one partial reward (not correct).
    samples += [sample("a", "sample", s, 20, "length") for s in (1.0, 0.0, 1.0, 0.0)]
    samples += [sample("b", "sample", s, 30) for s in (0.0, 0.0, 0.5, 0.0)]
    m = summarize(samples, 4)
    assert m["problems"] == 2
    assert m["accuracy"] == 0.5
    assert m["avg@4"] == pytest.approx(2 / 8)
    assert m["pass@1"] == pytest.approx(m["avg@4"])  # pass@1 is avg@n
    # a: 1 - C(2,2)/C(4,2) = 5/6; b: 0 → 5/12
    assert m["pass@2"] == pytest.approx(5 / 12)
    assert m["pass@4"] == pytest.approx(0.5)
    assert m["mean_length"] == 25.0  # of the sampled pass
    assert m["truncation_rate"] == 0.5
    assert m["mean_reward"] == pytest.approx(2.5 / 8)


def test_greedy_only_summary_has_no_pass_at_k():
    m = summarize([sample("a", "greedy", 1.0, 64, "length")], 1)
    assert m == {"problems": 1, "accuracy": 1.0, "mean_reward": 1.0, "mean_length": 64.0, "truncation_rate": 1.0}


def test_table_columns_and_cells():
    results = [{"metrics": {"problems": 2, "accuracy": 0.5, "avg@4": 0.25, "pass@4": 0.5, "pass@2": 0.4,
                            "pass@1": 0.25, "mean_reward": 0.3, "mean_length": 25.0, "truncation_rate": 0.5}}]
    assert columns(results) == ["problems", "accuracy", "avg@4", "pass@1", "pass@2", "pass@4", "mean_length",
                                "truncation_rate"]
    assert cell("accuracy", 0.5) == "50.0" and cell("mean_length", 25.04) == "25.0"
    assert cell("problems", 2) == "2" and cell("pass@2", None) == "-"

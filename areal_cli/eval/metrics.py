"""The numbers the reasoning papers report, from per-sample scores.

A completion is correct when its reward is 1 (the task's own verifier said so); partial
rewards count in `mean_reward` only.

- accuracy: the fraction of problems the greedy completion solves;
- avg@k: the mean correctness of k sampled completions per problem (= pass@1 estimated from k);
- pass@k: the chance that at least one of k completions drawn from the n sampled is correct,
  by the unbiased estimator of Chen et al. 2021, averaged over problems:
  pass@k = 1 − C(n−c, k) / C(n, k)  (n samples, c correct);
- mean_length: generated tokens per completion; truncation_rate: the fraction that hit
  max_new_tokens without stopping.
"""

from __future__ import annotations

from collections import defaultdict


def is_correct(score: float) -> bool:
    return score >= 1.0 - 1e-9


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 − C(n−c, k)/C(n, k), as the product 1 − Π_{i=n−c+1..n} (1 − k/i) (no big binomials)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def k_values(n: int) -> list[int]:
    """The k reported for n samples: 1, 2, 4, … up to n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def mean_pass_at_k(correct_per_problem: list[list[bool]], k: int) -> float:
    """pass@k averaged over problems; every problem must have the same number of samples."""
    values = [pass_at_k(len(row), sum(row), k) for row in correct_per_problem]
    return sum(values) / len(values)


def summarize(samples: list[dict], n_samples: int) -> dict:
    """Metrics of one (model, task) from its sample records (see runner.SampleRecord keys)."""
    greedy = [s for s in samples if s["pass"] == "greedy"]
    sampled = [s for s in samples if s["pass"] == "sample"]
    out: dict = {"problems": len({s["prompt_id"] for s in samples})}
    if greedy:
        out["accuracy"] = _mean(is_correct(s["score"]) for s in greedy)
    if sampled:
        rows = _by_problem(sampled)
        out[f"avg@{n_samples}"] = _mean(is_correct(s["score"]) for s in sampled)
        for k in k_values(n_samples):
            out[f"pass@{k}"] = mean_pass_at_k(rows, k)
    lengths_of = sampled or greedy  # the sampled pass when there is one, as papers report it
    out["mean_reward"] = _mean(s["score"] for s in lengths_of)
    out["mean_length"] = _mean(s["length"] for s in lengths_of)
    out["truncation_rate"] = _mean(s["finish_reason"] == "length" for s in lengths_of)
    return out


def _by_problem(samples: list[dict]) -> list[list[bool]]:
    rows: dict[str, list[bool]] = defaultdict(list)
    for s in samples:
        rows[s["prompt_id"]].append(is_correct(s["score"]))
    return list(rows.values())


def _mean(values) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else 0.0

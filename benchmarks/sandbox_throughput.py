"""Code reward calls per second for a trivial passing HumanEval-style candidate.

    python benchmarks/sandbox_throughput.py [calls] [workers] [problems]

Sequential calls in this process (one `score()` at a time), then `workers` concurrent calls
through a RewardPool. Prints the calls/s of each; the isolation that ran is in the output.
With `problems` > 0, also the mean seconds per HumanEval problem over the first `problems`
canonical solutions (sequential; every one must pass).
"""

from __future__ import annotations

import sys
import time

from areal_cli.config.task import RewardConfig
from areal_cli.rewards import RewardPool, score
from areal_cli.tasks import Problem

PROBLEM = Problem(
    "bench/0", "", "",
    {"code_prefix": "def add(a, b):\n", "test": "def check(f):\n    assert f(1, 2) == 3\n",
     "entry_point": "add"},
)  # fmt: skip
COMPLETION = "    return a + b\n"


def main(calls: int = 40, workers: int = 2, problems: int = 0) -> None:
    cfg = RewardConfig(fn="code")
    assert score(COMPLETION, PROBLEM, cfg) == 1.0  # warm up, and check it passes
    t0 = time.perf_counter()
    for _ in range(calls):
        assert score(COMPLETION, PROBLEM, cfg) == 1.0
    seq = calls / (time.perf_counter() - t0)
    with RewardPool(cfg, workers) as pool:
        pool.submit(COMPLETION, PROBLEM).result()
        t0 = time.perf_counter()
        results = [f.result() for f in [pool.submit(COMPLETION, PROBLEM) for _ in range(calls)]]
        par = calls / (time.perf_counter() - t0)
    assert all(r.score == 1.0 for r in results), results[:3]
    print(f"sequential: {seq:.1f} calls/s; pool of {workers}: {par:.1f} calls/s")
    if problems:
        print(f"HumanEval: {humaneval_s(problems) * 1000:.0f} ms per problem ({problems} problems)")


def humaneval_s(problems: int) -> float:
    from areal_cli.tasks.humaneval import read_all, to_problem

    chosen = [to_problem(record, "") for record in read_all()[:problems]]
    t0 = time.perf_counter()
    failed = [p.id for p in chosen if score(p.answer, p, RewardConfig(fn="code")) != 1.0]
    assert not failed, failed
    return (time.perf_counter() - t0) / len(chosen)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))

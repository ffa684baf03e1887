"""A user reward: 1 when the last number in the completion equals the reference, else 0.

    areal train reward.fn=examples.last_number_reward:score

areal calls ``score(completion, problem)`` in its reward pool, with ``reward.timeout_s`` per call; a
call that raises, hangs or returns a non-finite value scores 0 and is counted. It is an example, not
a good reward: a completion listing many numbers can end on the right one by chance; the shipped
verifiers (``reward.fn=auto``) take the line after "Answer:" first.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def score(completion: str, problem) -> float:
    numbers = NUMBER.findall(completion)
    try:
        return float(bool(numbers) and float(numbers[-1]) == float(problem.answer))
    except ValueError:  # a reference that is not a number
        return 0.0

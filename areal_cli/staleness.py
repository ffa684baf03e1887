"""The staleness rule (rollout.max_staleness = η), in one place: a group whose first model token is
of policy version f may train only in the batch of a step s with s - f <= η.

Everything that bounds staleness asks these two functions: the controller's admission (no group is
admitted that no batch could take, ``controller/admission.py``), the controller's drop of buffered
groups and its ``StaleBefore`` word to the workers (``controller/main.py``), and a rollout worker's
own bound after each weight update together with the workflow that stops such groups
(``rollout/main.py``, ``Workflow.drop_stale``). docs/concepts/staleness.md explains the rule.
"""

from __future__ import annotations


def oldest_trainable(step: int, max_staleness: int) -> int:
    """The oldest first-token version the batch of ``step`` (or a later one) can take."""
    return step - max_staleness


def last_trainable_step(version: int, max_staleness: int) -> int:
    """The last step whose batch can take a group whose first token is of ``version``."""
    return version + max_staleness


def too_stale(first_version: int, oldest: int) -> bool:
    """Whether a group whose first token is of ``first_version`` is older than ``oldest``
    (``oldest_trainable``): no batch still to come can train it."""
    return first_version < oldest

"""The dataset cursor: train problems in a seeded order, epoch after epoch, with a requeue."""

from __future__ import annotations

import collections
import random

from areal_cli.tasks import Problem


class Cursor:
    def __init__(self, problems: list[Problem], seed: int):
        if not problems:
            raise ValueError("the training split is empty: raise task.size or check the dataset file")
        self.problems, self.seed = problems, seed
        self.epoch, self.index = 0, 0
        self.order = self._order(0)
        self.requeued: collections.deque[tuple[str, Problem]] = collections.deque()

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(self.seed * 7919 + epoch).shuffle(order)
        return order

    def next(self) -> tuple[str, Problem]:
        """(prompt_id, problem); prompt ids are unique over the run (epoch suffix after the first)."""
        if self.requeued:
            return self.requeued.popleft()
        if self.index == len(self.order):
            self.epoch, self.index = self.epoch + 1, 0
            self.order = self._order(self.epoch)
        problem = self.problems[self.order[self.index]]
        self.index += 1
        pid = problem.id if self.epoch == 0 else f"{problem.id}#e{self.epoch}"
        return pid, problem

    def requeue(self, prompt_id: str, problem: Problem) -> None:
        """Put a prompt back at the front (its group was dropped and must be regenerated)."""
        self.requeued.append((prompt_id, problem))

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index,
                "requeued": [[pid, p.to_dict()] for pid, p in self.requeued]}

    def load_state(self, state: dict) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self.order = self._order(self.epoch)
        self.requeued = collections.deque((pid, Problem.from_dict(p)) for pid, p in state["requeued"])

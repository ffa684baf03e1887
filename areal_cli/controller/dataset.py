"""The dataset cursor: train problems in a seeded order, epoch after epoch, with a requeue; and the
training split it draws from (``training_split``).

Every prompt drawn gets a sequence number (its place in the stream); a requeued prompt keeps
it, so "admission order" batches and resumes see the same order as an uninterrupted run. It
draws only from the problems it is given: the train split, which never holds a held-out problem
(tasks/splits.py).
"""

from __future__ import annotations

import heapq
import json
import random

from areal_cli.rundir import RunDir
from areal_cli.tasks import Problem, load_split, split_report


class Cursor:
    def __init__(self, problems: list[Problem], seed: int):
        if not problems:
            raise ValueError("the training split is empty: raise task.size or check the dataset "
                             "file")
        self.problems, self.seed = problems, seed
        self.drawn = 0  # prompts drawn from the stream so far
        self.requeued: list[tuple[int, str, Problem]] = []  # heap by sequence number
        self._order: tuple[int, list[int]] = (-1, [])  # (epoch, its shuffled order)

    def _at(self, seq: int) -> tuple[str, Problem]:
        epoch, index = divmod(seq, len(self.problems))
        if self._order[0] != epoch:
            order = list(range(len(self.problems)))
            random.Random(self.seed * 7919 + epoch).shuffle(order)
            self._order = (epoch, order)
        problem = self.problems[self._order[1][index]]
        return (problem.id if epoch == 0 else f"{problem.id}#e{epoch}"), problem

    def next(self) -> tuple[int, str, Problem]:
        """(sequence number, prompt_id, problem); requeued prompts first, oldest first."""
        if self.requeued:
            return heapq.heappop(self.requeued)
        seq = self.drawn
        self.drawn += 1
        pid, problem = self._at(seq)
        return seq, pid, problem

    def requeue(self, seq: int, prompt_id: str, problem: Problem) -> None:
        """Put a prompt back (its group was dropped, or in flight at a crash): drawn again next."""
        heapq.heappush(self.requeued, (seq, prompt_id, problem))

    def state(self) -> dict:
        return {"drawn": self.drawn,
                "requeued": [[s, pid, p.to_dict()] for s, pid, p in self.requeued]}

    def load_state(self, state: dict) -> None:
        self.drawn = state["drawn"]
        self.requeued = [(s, pid, Problem.from_dict(p)) for s, pid, p in state["requeued"]]
        heapq.heapify(self.requeued)


def training_split(cfg, rd: RunDir, log) -> list[Problem]:
    """The train split; splits.json records both splits, what was removed to keep them
    disjoint by content, and their overlap (0, or the run stops here)."""
    train, held = load_split(cfg.task, "train"), load_split(cfg.task, "eval")
    report = split_report(cfg.task, train, held)
    rd.splits.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    log.info("splits: %d train problems (%d held-out draws removed), %d eval problems; %s; "
             "overlap %d",
             len(train.problems), train.report.removed_other_side, len(held.problems),
             report["space"]["text"], report["overlap"])
    if report["overlap"]:
        raise RuntimeError(f"{report['overlap']} eval problems are in the training split (see "
                           "splits.json)")
    return train.problems

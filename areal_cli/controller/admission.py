"""The staleness admission rule (docs/concepts/staleness.md, "The admission rule"), as a small pure
class (tested on its own).

With B groups per step and policy version v, a new group is admitted only while

    accepted + running < (η + v + 1) · B     and     running < max_concurrent

Rejected groups (dynamic sampling) and groups dropped for staleness free their slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_cli.staleness import last_trainable_step


@dataclass
class Admission:
    batch_size: int  # B
    max_staleness: int  # η
    max_concurrent: int  # bound on groups generating at once
    version: int = 0  # trainer's policy version v (optimizer steps done)
    accepted: int = 0  # groups finished and kept (buffered or trained)
    running: int = 0  # groups admitted and not finished

    def can_admit(self) -> bool:
        # a group admitted now (first token of version v at the earliest) can go into the batches of
        # steps 0 .. last_trainable_step(v, η): no more groups than those batches take are accepted
        # or running
        limit = (last_trainable_step(self.version, self.max_staleness) + 1) * self.batch_size
        return self.accepted + self.running < limit and self.running < self.max_concurrent

    def admit(self) -> None:
        assert self.can_admit(), "admission past the staleness bound"
        self.running += 1

    def finish(self, kept: bool) -> None:
        """A group came back; ``kept=False`` when it was filtered out (its slot is freed)."""
        self.running -= 1
        self.accepted += int(kept)

    def drop_accepted(self) -> None:
        """An accepted group was dropped later (too stale to train): free its slot."""
        self.accepted -= 1

    def state(self) -> dict:
        return {"version": self.version, "accepted": self.accepted, "running": self.running}

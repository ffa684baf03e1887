"""The Problem record every task source produces, and helpers shared by the sources."""

from __future__ import annotations

from dataclasses import dataclass, field

SPLITS = ("train", "eval")


@dataclass
class Problem:
    """One prompt with its reference answer; what the controller hands to rollout workers."""

    id: str
    """Stable and unique within the dataset, e.g. "basic_arithmetic/train/17"."""
    prompt: str
    """The user message text, answer-format instruction included."""
    answer: str
    """Reference answer as text."""
    meta: dict = field(default_factory=dict)
    """JSON/msgpack-serializable extras the scorer needs (reasoning-gym metadata, tests, ...)."""
    key: str = ""
    """Content key (tasks/splits.py): the normalised question, or the task's own notion of the
    same problem; the train and eval splits never share one."""

    def to_dict(self) -> dict:
        """Its fields as a dict for the wire (``meta`` the same object, not a copy: every caller
        serializes it at once; dataclasses.asdict's deep copy took 6% of an agent worker's time)."""
        return {"id": self.id, "prompt": self.prompt, "answer": self.answer, "meta": self.meta,
                "key": self.key}

    @classmethod
    def from_dict(cls, d: dict) -> Problem:
        return cls(id=str(d["id"]), prompt=d["prompt"], answer=d["answer"], meta=d.get("meta", {}),
                   key=d.get("key", ""))


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: use 'train' or 'eval'")


def with_instruction(text: str, instruction: str) -> str:
    """The prompt as the user sees it: the question, then the answer-format instruction."""
    return f"{text.rstrip()}\n\n{instruction}" if instruction else text


def cap(items: list, size: int) -> list:
    return items[:size] if size > 0 else items


def check_unique_ids(problems: list[Problem], where: str) -> None:
    seen: set[str] = set()
    for p in problems:
        if p.id in seen:
            raise ValueError(
                f"{where}: duplicate id {p.id!r}; make task.id_field unique or unset it"
            )
        seen.add(p.id)

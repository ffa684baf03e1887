"""Train and eval splits disjoint by content, and the figures that show it.

Every problem has a content key: its question text normalised (without the answer-format
instruction), or what the task defines as "the same problem" (reasoning-gym arithmetic: the
expression). The two splits never share a key:

- Generated tasks (reasoning-gym): the space of problems itself is partitioned by a stable
  hash of the key; ``task.eval_share`` of the key space is held out. The eval split draws from
  its own seed's stream and keeps distinct held-out problems; the training split draws from
  the train seed's stream and keeps only training-side problems, so training can never yield a
  held-out problem, even one that is not among the eval_size chosen.
- Finite tasks (files, HumanEval): the distinct keys are shuffled by seed and the first are
  held out; a training record whose key is held out (a duplicate) is dropped.

Each split reports how many problems were drawn, removed (held out on the other side, or
duplicates) and how many distinct problems each side of the space showed; a count is a lower
bound ("≥N") unless every problem of the sample was seen at least twice.
"""

from __future__ import annotations

import hashlib
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

SIDES = ("train", "eval")
DASHES = str.maketrans({c: "-" for c in "\u2212\u2010\u2011\u2012\u2013\u2014\ufe63\uff0d"})
GIVE_UP_DRAWS = 2000
"""A stream that adds nothing new for max(this, 3 × the draws before) draws is exhausted."""


def normalize(text: str) -> str:
    """Question text as a key: NFKC, dashes and Unicode minus as "-", casefolded, whitespace
    collapsed and dropped around punctuation/operators, trailing full stop or "?" dropped."""
    text = unicodedata.normalize("NFKC", str(text)).translate(DASHES).casefold()
    text = " ".join(text.split())
    text = re.sub(r" ?([^\w ]) ?", r"\1", text)
    return text.rstrip(".?!")


def side_of(key: str, eval_share: float) -> str:
    """"eval" for the held-out eval_share of the key space (a stable hash), else "train"."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return "eval" if int.from_bytes(digest, "big") < eval_share * 2**64 else "train"


@dataclass
class SplitReport:
    """How one split was made; ``to_dict`` is what splits.json and eval.json hold."""

    split: str
    """"train" or "eval"."""
    problems: int = 0
    """Problems in the split."""
    distinct: int = 0
    """Distinct content keys in the split."""
    draws: int = 0
    """Problems generated (or records read) to make it."""
    removed_other_side: int = 0
    """Draws dropped because their content belongs to the other split."""
    removed_duplicates: int = 0
    """Draws dropped because the split already held their content (eval is deduplicated)."""
    seen: Counter = field(default_factory=Counter, repr=False)
    """Every key drawn, with its count: the sample of the space behind the distinct counts."""
    side: dict = field(default_factory=dict, repr=False)
    """key -> "train" | "eval" for every key in ``seen``."""
    exhaustive: bool = False
    """The space was read whole (a file), so the counts are exact."""

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("problems", "distinct", "draws", "removed_other_side",
                                                "removed_duplicates")}
        return out | {"space": space([self])}


def space(reports: list[SplitReport]) -> dict:
    """Distinct problems of each side among the draws of ``reports`` (pooled); "complete" when
    the sample saturated (every key seen twice or the data read whole), else lower bounds."""
    seen: Counter = Counter()
    side: dict = {}
    for r in reports:
        seen.update(r.seen)
        side.update(r.side)
    counts = Counter(side[k] for k in seen)
    complete = any(r.exhaustive for r in reports) or (bool(seen) and min(seen.values()) >= 2)
    draws = max((r.draws for r in reports),
                default=0) if any(r.exhaustive for r in reports) else sum(seen.values())
    out = {"train_distinct": counts["train"], "eval_distinct": counts["eval"], "draws": draws,
           "complete": complete}
    return out | {"text": describe_space(out)}


def describe_space(s: dict) -> str:
    mark = "" if s["complete"] else "≥"
    how = "every problem seen at least twice" if s["complete"] else "lower bounds"
    return (f"training side {mark}{s['train_distinct']} distinct problems, held-out side "
            f"{mark}{s['eval_distinct']} (from {s['draws']} problems drawn; {how})")


def draw(sample: Callable[[int], tuple[str, object]], split: str, want: int, eval_share: float,
         where: str) -> tuple[list, SplitReport]:
    """``want`` items of ``split``'s side from the stream ``sample(i) -> (key, item)``, i = 0, 1, …

    eval keeps distinct keys only; train keeps every training-side draw (the generator's own
    distribution). A stream that stops adding usable keys is an error naming the counts."""
    report, chosen, last_gain = SplitReport(split), [], 0
    keys: set[str] = set()
    while len(chosen) < want:
        if report.draws - last_gain >= max(GIVE_UP_DRAWS, 3 * last_gain):
            raise ValueError(_exhausted(report, split, want, eval_share, where))
        key, item = sample(report.draws)
        report.draws += 1
        report.seen[key] += 1
        report.side[key] = report.side.get(key) or side_of(key, eval_share)
        if report.side[key] != split:
            report.removed_other_side += 1
        elif split == "eval" and key in keys:
            report.removed_duplicates += 1
        else:
            last_gain = report.draws
            keys.add(key)
            chosen.append(item)
    report.problems, report.distinct = len(chosen), len(keys)
    return chosen, report


def _exhausted(report: SplitReport, split: str, want: int, eval_share: float, where: str) -> str:
    s = space([report])
    have = s[f"{split}_distinct"]
    total = s["train_distinct"] + s["eval_distinct"]
    if split == "eval":
        return (f"{where}: the held-out part of the problem space has only {have} distinct "
                f"problems (task.eval_share={eval_share} of the {total} distinct problems seen in "
                f"{report.draws} draws), fewer than task.eval_size={want}: raise task.eval_share, "
                f"lower task.eval_size to at most {have}, or enlarge the task's problem space "
                "(task.params)")
    return (f"{where}: only {have} distinct problems are left for training after holding out "
            f"task.eval_share={eval_share} (of {total} seen in {report.draws} draws): lower "
            "task.eval_share or enlarge the task's problem space (task.params)")


def hold_out(keys: list[str], split: str, eval_n: int, seed: int) -> tuple[list[int], SplitReport]:
    """Indices (file order) of ``split`` in a finite list: the distinct keys shuffled by seed, the
    first ``eval_n`` held out (one record each); train keeps every record of the other keys."""
    distinct = list(dict.fromkeys(keys))
    random.Random(seed).shuffle(distinct)
    held = set(distinct[:eval_n])
    return pick(keys, split, held)


def pick(keys: list[str], split: str, held: set[str]) -> tuple[list[int], SplitReport]:
    """Indices of ``split`` given the held-out key set; eval keeps the first record of each key."""
    report = SplitReport(split, draws=len(keys), exhaustive=True)
    report.seen.update(keys)
    report.side = {k: "eval" if k in held else "train" for k in keys}
    chosen, taken = [], set()
    for i, key in enumerate(keys):
        if (key in held) != (split == "eval"):
            report.removed_other_side += 1
        elif split == "eval" and key in taken:
            report.removed_duplicates += 1
        else:
            taken.add(key)
            chosen.append(i)
    report.problems, report.distinct = len(chosen), len(taken)
    return chosen, report


def overlap(a: list, b: list) -> int:
    """Problems of ``a`` whose content key is also in ``b``."""
    keys = {p.key for p in b}
    return sum(p.key in keys for p in a)

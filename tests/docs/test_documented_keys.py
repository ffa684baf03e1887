"""Every config key written in README.md and the guides (``rollout.max_staleness``,
``engine.vllm.pause_mode=keep``, in prose, tables and code blocks) is a key of the schema: a renamed
or removed key fails here even where no runnable block uses it. File names such as ``eval.json`` are
not keys; the benchmark history is a record and is not checked."""

from __future__ import annotations

import dataclasses
import re
import typing

from conftest import ROOT

GROUPS = ("task", "reward", "algorithm", "engine", "workflow", "rollout", "trainer", "weights",
          "launcher",
          "cluster", "checkpoint", "eval", "logging")
KEY = re.compile(r"(?<![\w./-])((?:" + "|".join(GROUPS) + r")\.[a-z_][\w.]*)")
FILES = (".json", ".jsonl", ".md", ".png", ".yaml", ".log", ".py")


def dotted(cls: type, prefix: str = "") -> set[str]:
    out, hints = set(), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        out.add(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out |= dotted(hints[f.name], f"{prefix}{f.name}.")
    return out


def test_every_key_in_the_documents_is_a_schema_key():
    from areal_cli.config.schema import RootConfig
    from areal_cli.eval.config import EvalRunConfig

    keys = dotted(RootConfig) | dotted(EvalRunConfig)
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    unknown = []
    for doc in docs:
        if doc.parent.name in ("bench", "reference"):
            continue
        for key in (k.rstrip(".") for k in KEY.findall(doc.read_text())):
            known = key in keys or key.startswith("task.params.") or key.endswith(FILES) or (
                # a family: reward.code_*
                key.endswith("_") and any(k.startswith(key) for k in keys))
            if not known:
                unknown.append(f"{doc.relative_to(ROOT)}: {key}")
    assert not unknown, ("keys in the documents that the schema does not have:\n"
                         + "\n".join(unknown))

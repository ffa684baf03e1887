"""What `areal tasks` prints: the task presets (conf/task/) and reasoning-gym's datasets."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path


def presets(conf: Path) -> list[tuple[str, str]]:
    """(name, first comment line) of every conf/task/*.yaml."""
    out = []
    for path in sorted((conf / "task").glob("*.yaml")):
        lines = [x[1:].strip() for x in path.read_text().splitlines() if x.startswith("#")]
        out.append((path.stem, next((x for x in lines if x and not x.startswith("@package")), "")))
    return out


def datasets() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def options(dataset: str) -> list[tuple[str, str]]:
    """(param, default) of one reasoning-gym dataset; ValueError naming the valid datasets."""
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        import difflib

        close = difflib.get_close_matches(dataset, list(DATASETS), n=4, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"{dataset!r} is not a reasoning-gym dataset: {hint}the {len(DATASETS)} "
                         f"datasets are: {', '.join(sorted(DATASETS))}")
    config = DATASETS[dataset][1]()
    return [(f.name, repr(getattr(config, f.name))) for f in dataclasses.fields(config)
            if f.name not in ("size", "seed")]


def listing(conf: Path, width: int = 100) -> str:
    names = presets(conf)
    pad = max(len(n) for n, _ in names)
    lines = ["Task presets (areal train task=<name>):"]
    lines += [f"  {n:<{pad}}  {about}" for n, about in names]
    all_datasets = datasets()
    lines += ["", f"reasoning-gym datasets ({len(all_datasets)}; areal train task=reasoning_gym "
              "task.dataset=<name> task.params.<key>=<value>; `areal tasks <name>` lists its "
              "params):"]
    lines += textwrap.wrap("  ".join(all_datasets), width, initial_indent="  ",
                           subsequent_indent="  ")
    return "\n".join(lines)


def describe(dataset: str) -> str:
    opts = options(dataset)
    pad = max((len(k) for k, _ in opts), default=0)
    head = f"reasoning-gym {dataset}: areal train task=reasoning_gym task.dataset={dataset}"
    return "\n".join([head, "params (task.params.<key>=<value>) and their defaults:"]
                     + [f"  {k:<{pad}}  {v}" for k, v in opts])

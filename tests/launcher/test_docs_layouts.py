"""Every layout in docs/gpu.md's table, run through the launcher's plan on 8 (pretend) GPUs: the
generation and training GPUs it prints are the ones the table states."""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import ROOT

from areal_cli.launcher.plan import make_plan
from areal_cli.runconfig.compose import compose

ROW = re.compile(r"^\| `areal train ([^`]*)` \| ([^|]*) \| ([^|]*) \|$")


def gpu_ids(cell: str) -> list[int]:
    """"GPUs 0, 1 (two workers)" → [0, 1]; "GPUs 0–3" → [0, 1, 2, 3]."""
    cell = re.sub(r"\(.*?\)", "", cell)
    out = []
    for a, b in re.findall(r"(\d+)(?:–(\d+))?", cell):
        out += list(range(int(a), int(b or a) + 1))
    return out


ROWS = [m.groups() for line in (ROOT / "docs" / "gpu.md").read_text().splitlines() if (m := ROW.match(line))]


def test_the_table_was_found():
    assert len(ROWS) >= 6


@pytest.mark.parametrize("args,gen,train", ROWS)
def test_documented_layout_is_what_the_plan_does(tiny_model, tmp_path, args, gen, train):
    cfg = compose([f"model={tiny_model}", f"run_dir={tmp_path}", *shlex.split(args)])
    plan = make_plan(cfg, gpus=list(range(8)))
    want_train = gpu_ids(gen) if "same GPU" in train else gpu_ids(train)
    assert plan.devices["rollout"] == gpu_ids(gen) and plan.devices["trainer"] == want_train

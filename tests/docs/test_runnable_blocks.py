"""Every command in a block of README.md or docs/ marked ``<!-- runnable -->`` runs here on the CPU,
rewritten by the rules of ``runnable.py`` (a full run is planned as ``--dry-run`` plans it), so a
renamed key, preset, option or command fails this test instead of a reader."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_RUN, run_train

sys.path.insert(0, str(Path(__file__).parent))
from runnable import check_line, documents, runnable_lines  # noqa: E402

LINES = [line for doc in documents(ROOT) for line in runnable_lines(doc, ROOT)]


def test_readme_and_the_guides_have_runnable_blocks():
    where = {line.where.split(":")[0] for line in LINES}
    assert "README.md" in where and len(where) >= 5, where
    assert any(line.words[:2] == ["make", "train"] for line in LINES)


@pytest.fixture(scope="module")
def run(tiny_model, tmp_path_factory) -> Path:
    """A real 2-step run of the tiny model (with a checkpoint): what status, plot and resume read."""
    run_dir = tmp_path_factory.mktemp("docs") / "run"
    run_train(run_dir, f"model={tiny_model}", *TINY_RUN, "trainer.steps=2", "checkpoint.every=1")
    return run_dir


@pytest.mark.parametrize("line", LINES, ids=str)
def test_documented_command(line, run, tmp_path):
    check_line(line, tmp_path, run, ROOT / "Makefile")

"""The plan says how much the run's checkpoints will take on run_dir's disk, and warns before the
start where that does not fit (a long run would otherwise find out at its final save)."""

from __future__ import annotations

import json
import shutil

from areal_cli.launcher.plan import disk_notes
from areal_cli.runconfig.compose import compose


def test_the_checkpoints_of_the_default_model_fit_and_are_counted(tiny_model, tmp_path):
    cfg = compose([f"model={tiny_model}", f"run_dir={tmp_path}/run", "checkpoint.every=1",
                   "checkpoint.keep=3", "trainer.steps=10", "eval.every=5"])
    (line,) = disk_notes(cfg, tiny_model, tmp_path / "run")
    assert "final checkpoint" in line and "evaluation checkpoint" in line
    assert "3 trainer checkpoints" in line and "GB free" in line
    assert str(tmp_path) in line  # the nearest directory that exists


def test_a_model_too_large_for_the_disk_is_a_warning_that_names_the_fixes(tiny_model, tmp_path):
    big = tmp_path / "big"
    shutil.copytree(tiny_model, big)
    c = json.loads((big / "config.json").read_text())
    c.update(hidden_size=65536, intermediate_size=262144, num_hidden_layers=4096)  # ~250T params
    (big / "config.json").write_text(json.dumps(c))
    cfg = compose([f"model={tiny_model}", f"run_dir={tmp_path}/run"])
    lines = disk_notes(cfg, big, tmp_path / "run")
    assert len(lines) == 2 and "WARNING" in lines[1]
    assert "run_dir=" in lines[1] and "checkpoint.keep" in lines[1]


def test_lora_without_the_merged_copy_counts_no_model(tiny_model, tmp_path):
    cfg = compose([f"model={tiny_model}", f"run_dir={tmp_path}/run", "trainer.lora.rank=4",
                   "trainer.lora.merged_checkpoint=false", "eval.at_end=false"])
    (line,) = disk_notes(cfg, tiny_model, tmp_path / "run")
    assert "adapter alone" in line and "final checkpoint" not in line

"""`areal eval model=<run_dir>` checks its problems against that run's own training split: problems
the run trained on are dropped and reported in eval.json, with how the eval split was made."""

import json
import os
import shutil
import subprocess
import sys

from areal_cli.eval.cli import _problems
from areal_cli.eval.config import compose_eval
from areal_cli.runconfig.compose import compose, save_yaml
from areal_cli.tasks import load_problems
from areal_cli.tasks.splits import normalize

AREAL = [sys.executable, "-m", "areal_cli.cli", "eval"]
ENV = {**os.environ, "COLUMNS": "400", "TOKENIZERS_PARALLELISM": "false"}


def fake_run(root, model, overrides: list[str]):
    """A run_dir: its resolved config.yaml and a final checkpoint (the tiny model's weights)."""
    shutil.copytree(model, root / "checkpoints" / "final")
    save_yaml(compose(overrides), root / "config.yaml")
    return root


def test_a_run_trained_with_the_same_task_shares_nothing(tiny_model, tmp_path):
    run = fake_run(tmp_path / "same", tiny_model, ["task.size=300"])
    problems, info = _problems(compose_eval(["task.eval_size=20"])[0], [(str(run), run)])
    assert len(problems) == 20 and info["dropped_in_training"] == {str(run): 0}
    assert info["split"]["removed_other_side"] > 0 and info["split"]["distinct"] == 20


def test_eval_drops_and_reports_problems_the_run_trained_on(tiny_model, tmp_path):
    """The run held out only 10% of the space, so part of this eval split's 20% was its training data."""
    run = fake_run(tmp_path / "leaky", tiny_model, ["task.size=400", "task.eval_share=0.1"])
    out = tmp_path / "out"
    cmd = AREAL + [f"model={run}", "task.eval_size=20", "max_new_tokens=4", f"out_dir={out}", "reward.workers=1",
                   "engine.dtype=float32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "eval.json").read_text())
    info = data["run"]["splits"]["basic_arithmetic"]
    dropped = info["dropped_in_training"][str(run)]
    assert 0 < dropped < 20 and info["problems"] == 20 - dropped
    assert f"{dropped} in the training split of {run}, dropped" in proc.stderr
    trained = {normalize(p.meta["rg_entry"]["question"]) for p in load_problems(compose(
        ["task.size=400", "task.eval_share=0.1"]).task, "train")}
    asked = [s for s in data["results"][0]["samples"]]
    assert len(asked) == 20 - dropped
    held = {p.id: p for p in load_problems(compose_eval(["task.eval_size=20"])[0].task, "eval")}
    assert not {normalize(held[s["prompt_id"]].meta["rg_entry"]["question"]) for s in asked} & trained

"""The closing evaluation of ``areal train``: base vs trained on held-out problems, base cached."""

from __future__ import annotations

import json
import os
import shutil

from areal_cli.launcher.final_eval import evaluate_run
from areal_cli.runconfig.compose import compose


def test_final_eval_reports_both_models_and_caches_the_base(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("AREAL_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_model, run_dir / "checkpoints" / "final")
    cfg = compose([f"model={tiny_model}", "eval.at_end=true", "eval.size=6", "rollout.max_new_tokens=4",
                   "reward.workers=1", "engine.dtype=float32"])
    lines: list[str] = []
    out = evaluate_run(cfg, run_dir, say=lines.append)
    assert out["problems"] == 6
    assert out["base"]["accuracy"] == out["trained"]["accuracy"]  # the same weights on both sides
    assert json.loads((run_dir / "eval_final.json").read_text())["gain_points"] == 0
    assert any("held-out greedy accuracy, 6 basic_arithmetic problems" in x for x in lines)
    cached = list((tmp_path / "cache" / "eval").glob("base-*.json"))
    assert len(cached) == 1
    cached[0].write_text(json.dumps({**json.loads(cached[0].read_text()), "accuracy": 0.5}))
    # set, then removed: the undo restores the variable as it was (evaluate_run sets it in this process)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    again = evaluate_run(cfg, run_dir, say=lines.append, gpus="5")
    assert again["base"]["accuracy"] == 0.5  # read from the cache, not measured again
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"  # on the run's generation GPU, not GPU 0


def test_final_eval_off_or_without_checkpoint(tmp_path):
    cfg = compose(["eval.at_end=false"])
    assert evaluate_run(cfg, tmp_path) is None
    lines: list[str] = []
    assert evaluate_run(compose([]), tmp_path, say=lines.append) is None
    assert "no checkpoint" in lines[0]

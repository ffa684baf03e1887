"""The tracker fan-out in-process, on real libraries: a backend that breaks mid-run is switched
off with one warning and the others go on; the closing evaluation reopens the same tracker runs;
a missing library stops ``areal train`` before anything starts, naming the extra to install."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT
from readers import mlflow_client, offline, tensorboard_scalars, wandb_runs

from areal_cli.config.schema import RootConfig
from areal_cli.durable import append_jsonl
from areal_cli.runconfig.autos import resolve
from areal_cli.tracking.fanout import log_final_eval, open_for_run
from areal_cli.tracking.names import tracker_metrics, tracker_name

LOG = logging.getLogger("test.tracking")


def row(step: int) -> dict:
    return {"step": step, "version": step + 1, "reward_mean": 0.25 * step, "staleness_max": step % 3,
            "gen_tokens_per_s": 100.0 + step, "weights_sha": "ab12", "eval/basic_arithmetic/accuracy": 0.5,
            "grad_norm": float("nan")}


def config(*backends: str) -> RootConfig:
    """Resolved as `areal train` plans it here (logging.wandb_mode=auto: from the environment)."""
    cfg = RootConfig()
    cfg.logging.backends = ["jsonl", *backends]
    return resolve(cfg)


def test_names():
    m = tracker_metrics(row(2))
    assert m == {"train/version": 3.0, "reward/mean": 0.5, "staleness/max": 2.0, "perf/gen_tokens_per_s": 102.0,
                 "eval/basic_arithmetic/accuracy": 0.5}, "no step, no text, no NaN"
    assert [tracker_name(k) for k in ("pool_buffered", "reward_foo", "weight_pause_s", "loss", "log_s")] == [
        "rollout/buffered", "reward/foo", "weights/pause_s", "train/loss", "perf/log_s"]


def test_a_backend_that_breaks_mid_run_is_switched_off_once(tmp_path, caplog):
    fanout = open_for_run(tmp_path, config("tensorboard", "mlflow"), LOG, None, -1)
    fanout.log_step(row(0))
    shutil.rmtree(tmp_path / "mlruns")
    (tmp_path / "mlruns").write_text("not a directory any more")  # MLflow's store is gone
    with caplog.at_level(logging.WARNING, LOG.name):
        for step in (1, 2, 3):
            assert fanout.log_step(row(step)) >= 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("mlflow failed while logging step 1"), warnings
    fanout.close()
    assert sorted(tensorboard_scalars(tmp_path / "tensorboard")["reward/mean"]) == [0, 1, 2, 3]


def test_a_backend_that_cannot_start_leaves_the_others(tmp_path, caplog):
    cfg = config("mlflow", "tensorboard")
    (tmp_path / "blocked").write_text("")
    cfg.logging.mlflow_uri = (tmp_path / "blocked" / "mlruns").as_uri()  # below a file: cannot be made
    with caplog.at_level(logging.WARNING, LOG.name):
        fanout = open_for_run(tmp_path, cfg, LOG, None, -1)
    assert [t.name for t in fanout.trackers] == ["tensorboard"]
    assert "mlflow could not start" in caplog.text
    fanout.close()


def test_closing_evaluation_reopens_the_same_tracker_runs(tmp_path):
    cfg = config("tensorboard", "wandb", "mlflow")
    with offline(tmp_path / "home"):
        fanout = open_for_run(tmp_path, cfg, LOG, None, -1)
        for step in (0, 1):
            fanout.log_step(row(step))
            append_jsonl(tmp_path / "metrics.jsonl", [row(step)])
        fanout.close()
        result = {"base": {"accuracy": 0.25}, "trained": {"accuracy": 0.5}, "gain_points": 25.0}
        log_final_eval(tmp_path, cfg, result, ["held-out greedy accuracy ..."], LOG)
    state = json.loads((tmp_path / "tracking.json").read_text())
    tb = tensorboard_scalars(tmp_path / "tensorboard")
    assert tb["eval_final/trained_accuracy"] == {1: 0.5} and tb["eval_final/gain_points"] == {1: 25.0}
    runs = wandb_runs(tmp_path)
    assert [r["id"] for r in runs] == [state["wandb"]["id"]] * 2
    assert runs[1]["summary"]["eval_final/trained_accuracy"] == 0.5
    client = mlflow_client(tmp_path)
    run = client.get_run(state["mlflow"]["run_id"])
    assert run.data.metrics["eval_final/base_accuracy"] == 0.25 and run.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["config.yaml", "eval_final.txt"]


BLOCK_WANDB = ("import sys; sys.modules['wandb'] = None; from areal_cli.cli import main; "
               "sys.argv = ['areal', 'train', '--dry-run', *sys.argv[1:]]; main()")


@pytest.mark.parametrize("backends,needle", [
    ("[jsonl,wandb]", "pip install 'areal-cli[tracking]'"),
    ("[jsonl,tensorbord]", "unknown backend 'tensorbord': use any of jsonl, tensorboard, wandb, mlflow"),
])
def test_missing_library_or_unknown_backend_exits_2(backends, needle):
    proc = subprocess.run([sys.executable, "-c", BLOCK_WANDB, f"logging.backends={backends}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr

"""A short real CPU run logging to every backend, then a resume from a checkpoint two steps back
(as after a crash): each tracker's logs, read back with its own library, hold every metric of
metrics.jsonl under its name, at its step, once, in one tracker run."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_RUN, read_jsonl, run_train
from readers import mlflow_client, offline, tensorboard_accumulator, tensorboard_scalars, wandb_runs

from areal_cli.tracking.names import tracker_metrics

ALL = "logging.backends=[jsonl,tensorboard,wandb,mlflow]"
# set here, so the hyperparameters the trackers record do not follow the default
LR = "trainer.lr=3e-5"


# a run and its resume (~45 s on 2 cores): `make test-slow`, which CI runs too
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def resumed(tiny_model, tmp_path_factory):
    """Steps 0-3 with a checkpoint at 2; then resume with trainer.steps=6: steps 2 and 3 are
    trained (and logged) again, then 4 and 5. Returns (run_dir, rows before, rows after)."""
    run_dir = tmp_path_factory.mktemp("tracked")
    with offline(tmp_path_factory.mktemp("wandb-home")):
        run_train(run_dir, f"model={tiny_model}", *TINY_RUN, "trainer.steps=4",
                  "checkpoint.every=2", ALL, LR,
                  "logging.samples_every=2", "logging.samples=3")
        before = read_jsonl(run_dir / "metrics.jsonl")
        run_train(run_dir, f"resume={run_dir}", "trainer.steps=6")
    return run_dir, before, read_jsonl(run_dir / "metrics.jsonl")


def test_resume_really_logged_steps_again(resumed):
    _, before, after = resumed
    assert [r["step"] for r in before] == [0, 1, 2, 3]
    assert [r["step"] for r in after] == [0, 1, 2, 3, 4, 5]
    assert all(r["log_s"] >= 0 for r in after)


def test_tensorboard_holds_metrics_jsonl_after_its_purge(resumed):
    run_dir, _, after = resumed
    scalars = tensorboard_scalars(run_dir / "tensorboard")
    for row in after:  # the retrained steps 2 and 3 replaced the first run's
        for name, value in tracker_metrics(row).items():
            assert scalars[name][row["step"]] == pytest.approx(value, rel=1e-6, abs=1e-9), (name,
                                                                                            row["step"])
    for name in ("reward/mean", "staleness/max", "perf/gen_tokens_per_s", "weights/sync_s",
                 "perf/log_s"):
        assert sorted(scalars[name]) == [0, 1, 2, 3, 4, 5], name
    acc = tensorboard_accumulator(run_dir / "tensorboard")
    assert "_hparams_/experiment" in acc.PluginTagToContent("hparams"), ("the config as "
                                                                         "hyperparameters")
    texts = {e.step: e.tensor_proto.string_val[0].decode()
             for e in acc.Tensors("samples/completions/text_summary")}
    assert sorted(texts) == [0, 2, 4]
    assert (texts[4].startswith("| step | prompt_id | prompt | completion |")
            and texts[4].count("\n") == 4)


def _expected(before, after, step):
    """W&B and MLflow cannot overwrite a step: the retrained steps 2 and 3 keep their first
    values."""
    return tracker_metrics((before if step in (2, 3) else after)[step])


def test_wandb_offline_run_continues_under_the_same_id(resumed):
    run_dir, before, after = resumed
    runs = wandb_runs(run_dir)
    run_id = json.loads((run_dir / "tracking.json").read_text())["wandb"]["id"]
    assert [r["id"] for r in runs] == [run_id, run_id]
    steps = [h["_step"] for r in runs for h in r["history"]]
    assert steps == [0, 1, 2, 3, 4, 5], "every step once, in order"
    for h in (h for r in runs for h in r["history"]):
        for name, value in _expected(before, after, h["_step"]).items():
            assert h[name] == pytest.approx(value), (name, h["_step"])
    tables = [h["_step"] for r in runs for h in r["history"] if h.get("samples/completions/_type")
              == "table-file"]
    assert tables == [0, 2, 4]
    assert runs[0]["config"]["trainer.lr"] == 3e-05, "the config as hyperparameters"


def test_mlflow_file_store_run_continues_under_the_same_id(resumed):
    run_dir, before, after = resumed
    client = mlflow_client(run_dir)
    exp = client.get_experiment_by_name("areal")
    (run,) = client.search_runs([exp.experiment_id])
    assert (run.info.run_id
            == json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["trainer.lr"] == "3e-05"
    for name in tracker_metrics(after[0]):
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted(m.step for m in history) == [0, 1, 2, 3, 4, 5], name
        for m in history:
            assert m.value == pytest.approx(_expected(before, after, m.step)[name]), (name, m.step)
    samples = sorted(a.path for a in client.list_artifacts(run.info.run_id, "samples"))
    assert samples == [f"samples/step_00000{s}.json" for s in (0, 2, 4)]
    table = json.loads(open(client.download_artifacts(run.info.run_id, samples[0])).read())
    assert table["columns"][:4] == ["step", "prompt_id", "prompt",
                                    "completion"] and len(table["data"]) == 3
    assert all(row[2] for row in table["data"]), "every sample shows its prompt"

"""MLflow: ``MlflowClient`` on ``logging.mlflow_uri``, by default a file store in
``<run_dir>/mlruns`` (no server, no network; `mlflow ui --backend-store-uri <run_dir>/mlruns`).

Parameters are the flattened config (written once: MLflow refuses to change a parameter), the
config itself is the artifact config.yaml, sample tables are artifacts samples/step_<n>.json. A
resume reopens the stored run id. MLflow keeps every value logged at a step, so after a crash
the steps between the checkpoint and the crash keep the values first logged (fanout.py)."""

from __future__ import annotations

import os
import time

from areal_cli.rundir import RunDir
from areal_cli.tracking.base import SAMPLE_COLUMNS, RunInfo, Tracker


class MlflowTracker(Tracker):
    name = "mlflow"

    def start(self, info: RunInfo) -> dict:
        uri = info.cfg.mlflow_uri or RunDir(info.run_dir).mlruns.resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps the file store in maintenance mode behind this switch; it is the one
            # backend that needs no server
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(uri)
        self.run_id = info.state.get("run_id")
        self.where = f"{uri}, experiment {info.cfg.project}"
        if self.run_id:
            self.client.update_run(self.run_id, status="RUNNING")
            return {"run_id": self.run_id}
        exp = self.client.get_experiment_by_name(info.cfg.project)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(info.cfg.project)
        self.run_id = self.client.create_run(exp_id, run_name=info.name).info.run_id
        self._params(info.hparams)
        self.client.log_text(self.run_id, info.config_yaml, "config.yaml")
        return {"run_id": self.run_id}

    def _params(self, hparams: dict) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in hparams.items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters per call
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id,
                              metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def log_samples(self, step: int, rows: list[list]) -> None:
        data = {c: [r[i] for r in rows] for i, c in enumerate(SAMPLE_COLUMNS)}
        self.client.log_table(self.run_id, data=data, artifact_file=f"samples/step_{step:06d}.json")

    def log_summary(self, step: int, values: dict[str, float], text: str) -> None:
        self.log_metrics(step, values)
        self.client.log_text(self.run_id, text, "eval_final.txt")

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")

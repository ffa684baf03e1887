"""Weights & Biases: the ``wandb`` client, online or offline (``<run_dir>/wandb/``).

The run id is made once and kept in tracking.json; a resume opens the same id
(``resume="allow"``). Offline, each start writes ``wandb/offline-run-<time>-<id>/``; ``wandb sync``
uploads them into one run. W&B refuses steps that go back, so after a crash the steps between the
checkpoint and the crash keep the values first logged (fanout.py does not send them again)."""

from __future__ import annotations

import secrets

from areal_cli.rundir import RunDir
from areal_cli.tracking.base import SAMPLE_COLUMNS, RunInfo, Tracker


class WandbTracker(Tracker):
    name = "wandb"

    def start(self, info: RunInfo) -> dict:
        import wandb

        run_id = info.state.get("id") or secrets.token_hex(8)
        mode = str(info.cfg.wandb_mode)  # resolved when the run was planned (config/resolve.py)
        self.run = wandb.init(
            project=info.cfg.project, name=info.name, id=run_id, resume="allow",
            dir=str(info.run_dir),
            mode=mode, config=None if info.state else info.hparams,
            reinit="create_new", settings=wandb.Settings(console="off", quiet=True))
        self.where = f"run {run_id} of project {info.cfg.project} ({mode}" + (
            f", {RunDir(info.run_dir).wandb}; `wandb sync` uploads it)"
            if mode == "offline" else ")")
        return {"id": run_id}

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, step: int, rows: list[list]) -> None:
        import wandb

        self.run.log({"samples/completions": wandb.Table(columns=SAMPLE_COLUMNS, data=rows)},
                     step=step)

    def log_summary(self, step: int, values: dict[str, float], text: str) -> None:
        self.run.summary.update(values)  # the runs table shows it; history holds every step already

    def close(self) -> None:
        self.run.finish()

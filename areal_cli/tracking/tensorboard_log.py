"""TensorBoard: event files in ``<run_dir>/tensorboard/`` through torch's SummaryWriter.

A resume from the checkpoint of version v opens the writer with ``purge_step=v``: TensorBoard's
readers then drop what the interrupted run logged from step v on, and the steps trained again
replace it, in the same run (directory)."""

from __future__ import annotations

from areal_cli.rundir import RunDir
from areal_cli.tracking.base import SAMPLE_COLUMNS, RunInfo, Tracker


class TensorBoardTracker(Tracker):
    name = "tensorboard"
    rewinds = True

    def start(self, info: RunInfo) -> dict:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = RunDir(info.run_dir).tensorboard
        self.where = f"{log_dir} (tensorboard --logdir {log_dir})"
        self.w = SummaryWriter(log_dir=str(log_dir), purge_step=info.resume_step, flush_secs=10)
        if not info.state:  # a new run: its config, once
            self._hparams(info.hparams)
            self.w.add_text("config", f"```\n{info.config_yaml}\n```", 0)
        return {"log_dir": log_dir.name}

    def _hparams(self, hparams: dict) -> None:
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        # the HParams dashboard links the run's config to these scalars of the same run
        for summary in hparams_summary(hparams, {"reward/mean": 0.0, "staleness/max": 0.0}):
            self.w.file_writer.add_summary(summary)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for tag, value in metrics.items():
            self.w.add_scalar(tag, value, step)

    def log_samples(self, step: int, rows: list[list]) -> None:
        self.w.add_text("samples/completions", markdown_table(SAMPLE_COLUMNS, rows), step)

    def log_summary(self, step: int, values: dict[str, float], text: str) -> None:
        self.log_metrics(step, values)
        self.w.add_text("eval_final/report", f"```\n{text}\n```", step)

    def close(self) -> None:
        self.w.close()


def markdown_table(columns: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        text = f"{v:.3g}" if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", " ⏎ ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows])

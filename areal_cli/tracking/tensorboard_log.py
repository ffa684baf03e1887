"""TensorBoard: event files in ``<run_dir>/tensorboard/``, written with the ``tensorboard``
package's own event writer and protos (torch's SummaryWriter would import torch into the controller:
~130 MB).

A resume from the checkpoint of version v opens the writer with ``purge_step=v``: TensorBoard's
readers then drop what the interrupted run logged from step v on, and the steps trained again
replace it, in the same run (directory)."""

from __future__ import annotations

import time

from areal_cli.rundir import RunDir
from areal_cli.tracking.base import SAMPLE_COLUMNS, RunInfo, Tracker


class TensorBoardTracker(Tracker):
    name = "tensorboard"
    rewinds = True

    def start(self, info: RunInfo) -> dict:
        log_dir = RunDir(info.run_dir).tensorboard
        self.where = f"{log_dir} (tensorboard --logdir {log_dir})"
        self.w = EventWriter(log_dir, purge_step=info.resume_step)
        if not info.state:  # a new run: its config, once
            self._hparams(info.hparams)
            self.w.text("config", f"```\n{info.config_yaml}\n```", 0)
        return {"log_dir": log_dir.name}

    def _hparams(self, hparams: dict) -> None:
        from tensorboard.plugins.hparams import summary_v2 as hp

        # the HParams dashboard links the run's config to these scalars of the same run
        metrics = [hp.Metric("reward/mean"), hp.Metric("staleness/max")]
        values = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k,
                  v in hparams.items()}
        self.w.summary(hp.hparams_config_pb([hp.HParam(k) for k in values], metrics), 0)
        self.w.summary(hp.hparams_pb(values), 0)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for tag, value in metrics.items():
            self.w.scalar(tag, value, step)

    def log_samples(self, step: int, rows: list[list]) -> None:
        self.w.text("samples/completions", markdown_table(SAMPLE_COLUMNS, rows), step)

    def log_summary(self, step: int, values: dict[str, float], text: str) -> None:
        self.log_metrics(step, values)
        self.w.text("eval_final/report", f"```\n{text}\n```", step)

    def close(self) -> None:
        self.w.close()


class EventWriter:
    """Scalars, text and summaries into one event file. ``purge_step``: a resumed run's first step;
    a SessionLog START at that step tells TensorBoard's readers to drop what an earlier writer
    logged from there on."""

    def __init__(self, log_dir, purge_step: int | None = None, flush_secs: int = 10):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event = Event
        self.file = EventFileWriter(str(log_dir), flush_secs=flush_secs)
        if purge_step is not None:
            self.file.add_event(Event(step=purge_step, wall_time=time.time(),
                                      session_log=SessionLog(status=SessionLog.START)))

    def summary(self, summary, step: int) -> None:
        self.file.add_event(self._event(summary=summary, step=step, wall_time=time.time()))

    def scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.summary(Summary(value=[Summary.Value(tag=tag, simple_value=float(value))]), step)

    def text(self, tag: str, text: str, step: int) -> None:
        """A text-plugin summary, under ``<tag>/text_summary`` as TensorBoard's other writers name
        it."""
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
            plugin_name="text", content=TextPluginData(version=0).SerializeToString()))
        tensor = TensorProto(dtype="DT_STRING", string_val=[text.encode()],
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        self.summary(Summary(value=[Summary.Value(tag=f"{tag}/text_summary", metadata=meta,
                                                  tensor=tensor)]), step)

    def close(self) -> None:
        self.file.close()


def markdown_table(columns: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        text = f"{v:.3g}" if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", " ⏎ ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows])

"""The trackers of one process, behind one object that never raises.

The controller opens a ``TrackerFanout`` once (``open_for_run``): each backend of
``logging.backends`` starts, and what it needs to reopen the same tracker run (its id) goes to
``<run_dir>/tracking.json``. Every step row is sent to every backend, then written to
metrics.jsonl, so metrics.jsonl says which steps the trackers hold: after a resume, a backend that
cannot overwrite a step (W&B, MLflow) is sent only steps past the last one it holds; TensorBoard
purges them itself and takes the retrained values. A backend that raises is switched off with one
warning; the run and metrics.jsonl go on. The launcher reopens the same tracker runs after the
closing evaluation (``log_final_eval``).
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from pathlib import Path

from areal_cli.config.schema import RootConfig
from areal_cli.config.trackers import BACKENDS, chosen
from areal_cli.rundir import RunDir
from areal_cli.tracking.base import RunInfo, Tracker
from areal_cli.tracking.names import flatten, tracker_metrics


def load_backend(name: str) -> Tracker:
    b = BACKENDS[name]
    return getattr(importlib.import_module(f"areal_cli.tracking.{b.module}"), b.cls)()


class TrackerFanout:
    def __init__(self, run_dir: Path, cfg: RootConfig, log: logging.Logger, names: list[str],
                 state: dict, resume_step: int | None = None, logged_step: int = -1):
        self.run_dir, self.log, self.state = Path(run_dir), log, state
        self.logged_step = logged_step  # the last step the backends already hold
        self.spent_s = 0.0  # in tracker calls, in all
        self.trackers: list[Tracker] = []
        from omegaconf import OmegaConf

        tree = OmegaConf.to_container(OmegaConf.structured(cfg))
        info = dict(run_dir=self.run_dir, name=self.run_dir.resolve().name, cfg=cfg.logging,
                    hparams=flatten(tree), config_yaml=OmegaConf.to_yaml(tree),
                    resume_step=resume_step)
        for name in names:
            t0 = time.perf_counter()
            tracker = self._call_new(name, RunInfo(**info, state=dict(state.get(name, {}))))
            if tracker is not None:
                self.trackers.append(tracker)
                log.info("%s: logging to %s (started in %.1fs)", name, tracker.where,
                         time.perf_counter() - t0)
        self._save()

    def _call_new(self, name: str, info: RunInfo) -> Tracker | None:
        try:
            tracker = load_backend(name)
            self.state[name] = tracker.start(info)
            return tracker
        except Exception as err:  # noqa: BLE001 — a tracker library's failure never stops training
            self.log.warning("%s could not start (%s: %s); the run goes on without it "
                             "(metrics.jsonl has every step)", name, type(err).__name__, err)
            return None

    def _save(self) -> None:
        from areal_cli.durable import atomic_write

        atomic_write(RunDir(self.run_dir).tracking, json.dumps(self.state, indent=1) + "\n")

    def _each(self, step: int | None, what: str, call) -> None:
        """``call(tracker)`` for every live backend (for ``step``: those that do not hold it yet);
        a backend that raises is switched off, with one warning."""
        for tracker in list(self.trackers):
            if step is not None and step <= self.logged_step and not tracker.rewinds:
                continue
            try:
                call(tracker)
            except Exception as err:  # noqa: BLE001 — a tracker library's failure never stops training
                self.trackers.remove(tracker)
                self.log.warning("%s failed while logging %s (%s: %s); it is off for the rest of "
                                 "this run (metrics.jsonl has every "
                                 "step)", tracker.name, what, type(err).__name__, err)

    def log_step(self, row: dict, samples: list[list] | None = None) -> float:
        """Send a metrics.jsonl row (and a table of its samples); returns the seconds it took,
        which also goes out as ``perf/log_s`` of the same step (that last call is not counted)."""
        t0 = time.perf_counter()
        step, metrics = row["step"], tracker_metrics(row)
        self._each(step, f"step {step}", lambda t: t.log_metrics(step, metrics))
        if samples:
            self._each(step, f"the samples of step {step}", lambda t: t.log_samples(step, samples))
        spent = time.perf_counter() - t0
        self._each(step, f"step {step}", lambda t: t.log_metrics(step, {"perf/log_s": spent}))
        self.logged_step = max(self.logged_step, step)
        self.spent_s += spent
        return spent

    def log_summary(self, step: int, values: dict[str, float], text: str) -> None:
        self._each(None, "the closing evaluation", lambda t: t.log_summary(step, values, text))

    def close(self) -> None:
        self._each(None, "the end of the run", lambda t: t.close())
        self.trackers = []


def open_for_run(run_dir: Path, cfg: RootConfig, log: logging.Logger,
                 resume_step: int | None, logged_step: int) -> TrackerFanout:
    """The controller's fan-out: new tracker runs for a new run; a resume (``resume_step`` set)
    reopens the runs named in tracking.json. ``logged_step``: the last step of metrics.jsonl
    before the resume cut it to its checkpoint."""
    state = read_state(run_dir) if resume_step is not None else {}
    return TrackerFanout(run_dir, cfg, log, chosen(cfg.logging.backends), state, resume_step,
                         logged_step)


def read_state(run_dir: Path) -> dict:
    path = RunDir(run_dir).tracking
    return json.loads(path.read_text()) if path.is_file() else {}


def log_final_eval(run_dir: Path, cfg: RootConfig, result: dict, report: list[str],
                   log: logging.Logger) -> None:
    """Reopen the run's tracker runs and add the closing evaluation at the last step."""
    state = read_state(run_dir)
    names = [n for n in chosen(cfg.logging.backends) if n in state]
    if not names:
        return
    from areal_cli.durable import read_jsonl

    rows, _ = read_jsonl(RunDir(run_dir).metrics)
    step = rows[-1]["step"] if rows else 0
    fanout = TrackerFanout(run_dir, cfg, log, names, state, None, logged_step=step)
    fanout.log_summary(step, {"eval_final/base_accuracy": result["base"]["accuracy"],
                               "eval_final/trained_accuracy": result["trained"]["accuracy"],
                               "eval_final/gain_points": result["gain_points"]}, "\n".join(report))
    fanout.close()

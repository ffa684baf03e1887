"""Experiment trackers: TensorBoard, Weights & Biases and MLflow mirror metrics.jsonl.

The controller, which already owns the metrics, opens a ``TrackerFanout`` (fanout.py) over
the backends named in ``logging.backends`` (registry.py: one module per backend behind the
``Tracker`` interface of base.py). metrics.jsonl stays the record; a tracker that fails is
switched off with one warning and never stops the run. Names are namespaced by names.py.
"""

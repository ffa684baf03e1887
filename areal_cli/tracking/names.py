"""metrics.jsonl keys → the trackers' namespaced names (``reward/mean``, ``perf/gen_tokens_per_s``).

One table for the keys the controller and trainer write; a key it does not know goes by its
prefix (``reward_x`` → ``reward/x``), else under ``train/``. Keys that already hold a ``/``
(``eval/<task>/accuracy``) keep their name. Only finite numbers are metrics.
"""

from __future__ import annotations

import math

NAMES: dict[str, str] = {
    "reward_mean": "reward/mean",
    "reward_timeouts": "reward/timeouts",
    "reward_errors": "reward/errors",
    "reward_nonfinite": "reward/nonfinite",
    "staleness_max": "staleness/max",
    "staleness_mean": "staleness/mean",
    "response_length_mean": "response/length_mean",
    "truncated_fraction": "response/truncated_fraction",
    "gen_tokens_per_s": "perf/gen_tokens_per_s",
    "train_tokens_per_s": "perf/train_tokens_per_s",
    "trained_tokens": "perf/trained_tokens",
    "step_time_s": "perf/step_time_s",
    "step_wall_s": "perf/step_wall_s",
    "wall_time_s": "perf/wall_time_s",
    "model_tflops_per_s": "perf/model_tflops_per_s",
    "peak_rss_gb": "perf/peak_rss_gb",
    "log_s": "perf/log_s",
    "weight_sync_s": "weights/sync_s",
    "weight_gather_s": "weights/gather_s",
    "weight_transfer_s": "weights/transfer_s",
    "weight_pause_s": "weights/pause_s",
    "filtered_groups": "rollout/filtered_groups",
    "stale_dropped": "rollout/stale_dropped",
    "stale_stopped": "rollout/stale_stopped",
    "stale_dropped_tokens": "rollout/stale_dropped_tokens",
    "version": "train/version",
}
PREFIXES = {"reward_": "reward/", "staleness_": "staleness/", "weight_": "weights/",
            "weights_": "weights/",
            "pool_": "rollout/", "response_": "response/"}
SKIP = {"step"}  # the x axis of every tracker, not a metric


def tracker_name(key: str) -> str:
    if key in NAMES:
        return NAMES[key]
    if "/" in key:
        return key
    for prefix, ns in PREFIXES.items():
        if key.startswith(prefix):
            return ns + key[len(prefix):]
    return f"train/{key}"


def tracker_metrics(row: dict) -> dict[str, float]:
    """Every finite number of a metrics.jsonl row under its tracker name (booleans and strings,
    e.g. ``weights_sha``, are no metrics)."""
    out = {}
    for key, value in row.items():
        if key in SKIP or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[tracker_name(key)] = float(value)
    return out


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """A nested config as ``{"trainer.lr": 2e-05, ...}``; lists become their text, None ""."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        elif isinstance(value, (bool, int, float, str)):
            out[f"{prefix}{key}"] = value
        else:
            out[f"{prefix}{key}"] = "" if value is None else str(value)
    return out

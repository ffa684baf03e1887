"""Figures of one model-size run (prints one JSON object): rates after warm-up, MFU and peak memory
(the trainer's metrics, where it writes them, and every GPU's peak from an nvidia-smi log), weight
updates per rollout worker, response lengths.

    python3 benchmarks/device/size_summary.py RUN_DIR [WARMUP] [GPU_MEM_CSV]

GPU_MEM_CSV: ``nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -l 2`` output.
Keys the trainer may not write yet are reported as null, never guessed.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
from pathlib import Path

from areal_cli.bench.summary import read_jsonl, response_lengths


def _median(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def gpu_peaks(csv: Path) -> dict:
    """GPU index → peak memory.used in GiB over the log."""
    peaks: dict[str, float] = {}
    if csv.is_file():
        for line in csv.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[1].isdigit():
                peaks[parts[0]] = max(peaks.get(parts[0], 0.0), int(parts[1]) / 1024)
    return {k: round(v, 2) for k, v in sorted(peaks.items())}


def summary(run_dir: Path, warmup: int, csv: Path | None) -> dict:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    post = rows[warmup:] or rows
    mem_keys = sorted({k for r in rows for k in r if "peak_gpu_mem" in k})
    updates = read_jsonl(run_dir / "weight_updates.jsonl")
    per_worker = collections.defaultdict(set)
    for u in updates:
        per_worker[u.get("worker")].add(u.get("version"))
    first = post[0] if post else {}
    return {
        "run_dir": str(run_dir), "steps": len(rows), "warmup_steps": warmup,
        "wall_time_s": rows[-1]["wall_time_s"] if rows else None,
        "step_time_s_median": _median([r.get("step_time_s") for r in post]),
        "step_wall_s_median": _median([r.get("step_wall_s") for r in post]),
        "train_tokens_per_s_median": _median([r.get("train_tokens_per_s") for r in post]),
        "gen_tokens_per_s_median": _median([r.get("gen_tokens_per_s") for r in post]),
        "trained_tokens_per_step_median": _median([r.get("trained_tokens") for r in post]),
        "mfu_median": _median([r.get("mfu") for r in post]),
        "mfu_per_step": [r.get("mfu") for r in rows],
        "grad_norm_per_step": [r.get("grad_norm") for r in rows],
        "skipped_steps": max((r.get("skipped_steps") or 0 for r in rows), default=0),
        "peak_gpu_mem_gb": {k: max((r[k] for r in rows if isinstance(r.get(k), (int, float))),
                                   default=None)
                            for k in mem_keys},
        "nvidia_smi_peak_gib_per_gpu": gpu_peaks(csv) if csv else {},
        "weight_sync_s_median": _median([r.get("weight_sync_s") for r in post]),
        "update_pause_s_median": _median([u.get("pause_total_s") for u in updates]),
        "update_parts_s_median": {k: _median([u.get(k) for u in updates])
                                  for k in sorted({k for u in updates for k in u})
                                  if k.endswith("_s")
                                  and _median([u.get(k) for u in updates]) is not None},
        "updates": len(updates),
        "adapter_delta_zero": sum(1 for u in updates if u.get("adapter_delta_zero")),
        "weights_unchanged": sum(1 for u in updates if u.get("weights_unchanged")),
        "probe_logp_change_min": min((u["probe_logp_change"] for u in updates
                                      if isinstance(u.get("probe_logp_change"), (int, float))),
                                     default=None),
        "update_total_s_median": _median([u.get("update_total_s") for u in updates]),
        "weight_versions_per_worker": {str(k): len(v) for k,
                                       v in sorted(per_worker.items(), key=str)},
        "logp_gap_fresh": [r.get("logp_gap_fresh") for r in rows if "logp_gap_fresh" in r],
        "response_length": response_lengths(run_dir, warmup),
        "metric_keys": sorted(first),
    }


if __name__ == "__main__":
    run = Path(sys.argv[1])
    warm = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    print(json.dumps(summary(run, warm, Path(sys.argv[3]) if len(sys.argv) > 3 else None),
                     indent=1))

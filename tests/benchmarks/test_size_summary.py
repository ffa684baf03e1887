"""benchmarks/device/size_summary.py on a run directory written here: medians after warm-up, the
peak memory of every GPU from an nvidia-smi log, and every worker's weight versions."""

from __future__ import annotations

import json

import pytest

from benchmarks.device.size_summary import summary


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_of_a_sized_run(tmp_path):
    _jsonl(tmp_path / "metrics.jsonl", [
        {"step": 0, "step_time_s": 9.0, "mfu": 0.10, "peak_gpu_mem_gb": 70.0, "wall_time_s": 50},
        {"step": 1, "step_time_s": 2.0, "mfu": 0.41, "peak_gpu_mem_gb": 71.5, "wall_time_s": 53},
        {"step": 2, "step_time_s": 4.0, "mfu": 0.39, "peak_gpu_mem_gb": 71.0, "wall_time_s": 58}])
    # 0.2, 0.3, 0.4
    _jsonl(tmp_path / "weight_updates.jsonl",
           [{"worker": w, "version": v, "pause_total_s": 0.1 * (v + 1)}
                                               for w in (0, 1) for v in (1, 2, 3)])
    _jsonl(tmp_path / "trajectories.jsonl",
           [{"trained_version": 1, "num_tokens": 8192, "finish_reason": "length"}])
    (tmp_path / "mem.csv").write_text("0, 30000\n1, 41000\n0, 61440\n1, 40000\nbad line\n")
    s = summary(tmp_path, 1, tmp_path / "mem.csv")
    assert s["step_time_s_median"] == 3.0 and s["mfu_median"] == 0.40  # steps 1 and 2 only
    assert s["peak_gpu_mem_gb"] == {"peak_gpu_mem_gb": 71.5}
    assert s["nvidia_smi_peak_gib_per_gpu"] == {"0": 60.0, "1": 40.04}  # 61440 MiB = 60 GiB
    assert (s["weight_versions_per_worker"] == {"0": 3, "1": 3}
            and s["update_pause_s_median"] == pytest.approx(0.3))
    assert s["response_length"]["p50"] == 8192 and s["train_tokens_per_s_median"] is None

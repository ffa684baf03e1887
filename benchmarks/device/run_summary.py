"""Figures of a finished run directory (prints JSON): rates after warm-up, pauses, rewards.

    python3 benchmarks/device/run_summary.py RUN_DIR [WARMUP]
"""

from __future__ import annotations

import json
import sys

from areal_cli.bench.summary import summarize_run

if __name__ == "__main__":
    s = summarize_run(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    s.pop("trainer_intervals")
    s.pop("generation_intervals")
    curve = s["reward_curve"]
    q = max(1, len(curve) // 4)
    s["reward_first_quarter"], s["reward_last_quarter"] = sum(curve[:q]) / q, sum(curve[-q:]) / q
    print(json.dumps(s, indent=1))

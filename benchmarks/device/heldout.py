"""Held-out greedy accuracy of one checkpoint (prints JSON); until `areal eval` lands.

    python3 benchmarks/device/heldout.py MODEL_DIR [key=value ...]   (Hydra overrides: task, eval.size)
"""

from __future__ import annotations

import json
import sys

from areal_cli.bench.heldout import greedy_accuracy
from areal_cli.runconfig.compose import compose

if __name__ == "__main__":
    cfg = compose(sys.argv[2:])
    print(json.dumps({"model": sys.argv[1], **greedy_accuracy(sys.argv[1], cfg)}))

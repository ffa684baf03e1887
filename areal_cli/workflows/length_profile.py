"""Response-length profiles (``rollout.length_profile``): each request's ``max_new_tokens`` drawn
from a distribution, EOS ignored, so that a model with random weights (which never stops where a
trained one would) generates responses with the long tail of real reasoning.

A profile is a quantile function: points (cumulative probability, fraction of
``rollout.max_new_tokens``), increasing in both, interpolated log-linearly in the fraction. A draw
depends only on the run's seed, the group id, the sample and the turn, so a synchronous and an
asynchronous run of the same workload generate the same lengths for the same prompts.

Built in:

* ``arithmetic_long`` — SmolLM2-135M-Instruct's own responses on ``task=arithmetic_long`` with
  ``rollout.max_new_tokens=512``, taken from the trained samples of the synchronous run of
  ``areal bench sync-vs-async`` (docs/bench/2gpu_h200_bench.json, modes.sync.response_length):
  p10 10, p50 53, p90 204 tokens, 4.6% stopped at 512, mean 91. As fractions of the cap: p10 0.0195,
  p50 0.1035, p90 0.398, and 1.0 from p95.4 on; the minimum (0.004) is an assumption. Its mean is
  0.190 of the cap (97 of 512; measured 91). Scaled to rollout.max_new_tokens=8192: p50 848, p90
  3264.
* ``fixed`` — every response exactly ``rollout.max_new_tokens`` tokens (memory and MFU at a length).

A file: JSON ``{"quantiles": [[0.0, 0.01], ..., [1.0, 1.0]], "source": "where the lengths come
from"}``.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

PROFILES = {
    "arithmetic_long": [(0.0, 0.004), (0.1, 10 / 512), (0.5, 53 / 512), (0.9, 204 / 512),
                        (1 - 0.0462, 1.0), (1.0, 1.0)],
    "fixed": [(0.0, 1.0), (1.0, 1.0)],
}


@dataclass(frozen=True)
class LengthProfile:
    name: str
    quantiles: tuple[tuple[float, float], ...]  # (cumulative probability, fraction of the cap)
    seed: int  # the run's seed

    def fraction(self, u: float) -> float:
        """The quantile function at ``u`` in [0, 1]."""
        pts = self.quantiles
        for (p0, f0), (p1, f1) in zip(pts, pts[1:], strict=False):
            if u <= p1:
                t = (u - p0) / (p1 - p0) if p1 > p0 else 1.0
                return math.exp(math.log(f0) + t * (math.log(f1) - math.log(f0)))
        return pts[-1][1]

    def draw(self, cap: int, key: str) -> int:
        """max_new_tokens of the request ``key`` (group:sample:turn), between 1 and ``cap``."""
        u = random.Random(f"{self.seed}:{key}").random()
        return max(1, min(cap, round(self.fraction(u) * cap)))


def load_profile(spec: str, seed: int = 0) -> LengthProfile | None:
    """The profile ``spec`` names ("" = none: lengths end at EOS or max_new_tokens as usual);
    raises ValueError naming the fix."""
    if not spec:
        return None
    if spec in PROFILES:
        points = PROFILES[spec]
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ValueError(f"rollout.length_profile={spec}: neither a built-in profile "
                             f"({', '.join(PROFILES)}) nor a file; give one of those or a JSON "
                             "file")
        try:
            points = [tuple(map(float, p)) for p in json.loads(path.read_text())["quantiles"]]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"rollout.length_profile={spec}: expected JSON {{\"quantiles\": [[p, "
                             f"fraction], ...]}} ({err})") from None
    ok = (len(points) >= 2 and points[0][0] == 0.0 and points[-1][0] == 1.0
          and all(0 < f <= 1 for _, f in points)
          and all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(points, points[1:], strict=False)))
    if not ok:
        raise ValueError(f"rollout.length_profile={spec}: quantiles must run from p=0 to p=1 with "
                         "fractions in (0, 1], both non-decreasing")
    return LengthProfile(spec, tuple(points), seed)

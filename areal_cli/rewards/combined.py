"""The reward of a rollout worker when reward.fn is more than one verifier: its parts (a verifier
in the worker's reward pool; model and judge in the reward-model process) scored side by side and
summed with reward.weights.

``make_rewards`` gives what the workflow submits to: a plain ``RewardPool`` for one verifier,
else a ``CombinedReward``, whose Future resolves to a ``RewardResult`` whose ``parts`` hold each
part's score and status ("<part>", "<part>_status") and, for served parts, the reward-model batch
it was scored in ("<part>_batch", "<part>_batch_workers"). The combined status is the first
failure (timeout, error, nonfinite) of any part, else "ok"; a failed part adds 0.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

from areal_cli.config.reward_models import MODEL_PARTS, part_name
from areal_cli.config.task import RewardConfig
from areal_cli.rewards.pool import RewardPool, RewardResult, settle
from areal_cli.tasks.base import Problem

FAILED = ("timeout", "error", "nonfinite")


class CombinedReward:
    def __init__(self, cfg: RewardConfig, served=None, num_workers: int = 1):
        """``served``: a ``client.ServedRewards`` (needed when a part is model or judge)."""
        self.cfg, self.served = cfg, served
        verifier = cfg.verifier()
        self.pool = RewardPool(verifier, num_workers) if verifier is not None else None
        self.weights = [float(w) for w in cfg.weights] or [1.0] * len(cfg.parts)
        if cfg.served and served is None:
            raise ValueError("reward.fn has a model or judge part: it needs the reward-model "
                             "process's client")

    def submit(self, completion: str, problem: Problem) -> Future:
        """Score every part; the Future resolves once all have (never raises)."""
        out: Future = Future()
        parts = self.cfg.parts
        futures = [self.served.submit(p, problem, completion) if p in MODEL_PARTS
                   else self.pool.submit(completion, problem) for p in parts]
        left, lock = [len(futures)], threading.Lock()

        def one_done(_):
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            settle(out, self._combine(parts, [f.result() for f in futures]))

        for f in futures:
            f.add_done_callback(one_done)
        return out

    def _combine(self, parts: list[str], results: list[RewardResult]) -> RewardResult:
        info, total, failed = {}, 0.0, None
        for part, weight, res in zip(parts, self.weights, results, strict=True):
            name = part_name(part)
            info[name], info[f"{name}_status"] = float(res.score), res.status
            info.update({f"{name}_{k}": v for k, v in res.parts.items()})
            total += weight * float(res.score)
            if failed is None and res.status in FAILED:
                failed = (res.status, f"{name}: {res.detail}")
        status, detail = failed or ("ok", "")
        return RewardResult(total, status, detail, parts=info)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if self.served is not None:
            self.served.close()


def make_rewards(cfg: RewardConfig, num_workers: int, served_client=None):
    """A ``RewardPool`` for one verifier, else a ``CombinedReward`` (``served_client()`` makes the
    reward-model client, called only when a part needs it)."""
    if len(cfg.parts) == 1 and not cfg.served:
        return RewardPool(cfg.verifier(), num_workers)
    return CombinedReward(cfg, served_client() if cfg.served else None, num_workers)

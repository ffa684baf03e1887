"""What the controller writes: metrics.jsonl (one line per step), trajectories.jsonl (one line
per trained sample) and weight_updates.jsonl (one line per worker per update). Each step row goes
to the experiment trackers (areal_cli/tracking) first, then to metrics.jsonl with ``log_s``, the
seconds those tracker calls took."""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path

import numpy as np

from areal_cli.config.schema import RootConfig
from areal_cli.durable import append_jsonl
from areal_cli.rundir import RunDir
from areal_cli.transport.messages import GroupResult
from areal_cli.workflows import workflow_spec

STALE_WASTE_WARN = 0.2
"""Share of the generated tokens in groups dropped as too stale above which the controller says so
(once)."""
SERVED_BY = {"model": "reward-model", "judge": "reward-model"}
"""The process that scores each served reward part (its log: logs/<process>.log)."""


class RewardFailed(RuntimeError):
    """A reward part failed on more than reward.max_error_fraction of a batch's samples."""


def part_metrics(rows: list[dict]) -> dict:
    """Per part of a combined reward.fn: reward_<part>_mean, the count of each failed status
    (reward_<part>_timeout, _error, _nonfinite, _parse_error) and, for served parts,
    reward_<part>_batch_mean and reward_<part>_batch_workers_max."""
    out: dict = {}
    parts = [k for k in (rows[0]["reward_parts"] if rows else {}) if "_" not in k]
    for part in parts:
        scores = [r["reward_parts"].get(part, 0.0) for r in rows]
        out[f"reward_{part}_mean"] = float(np.mean(scores))
        statuses = [r["reward_parts"].get(f"{part}_status", "ok") for r in rows]
        for status in ("timeout", "error", "nonfinite", "parse_error"):
            out[f"reward_{part}_{status}"] = statuses.count(status)
        batches = [r["reward_parts"][f"{part}_batch"] for r in rows
                   if f"{part}_batch" in r["reward_parts"]]
        if batches:
            out[f"reward_{part}_batch_mean"] = float(np.mean(batches))
            out[f"reward_{part}_batch_workers_max"] = int(max(
                r["reward_parts"].get(f"{part}_batch_workers", 0) for r in rows))
    return out


def check_batch_rewards(step: int, groups: list[GroupResult], max_fraction: float) -> None:
    """``check_reward_failures`` of a batch before it is sent to the trainer."""
    rows = [{"reward_status": s.reward_status, "reward_parts": s.reward_parts} for g in groups
            for s in g.samples]
    check_reward_failures(step, rows, max_fraction)


def check_reward_failures(step: int, rows: list[dict], max_fraction: float) -> None:
    """RewardFailed naming the part and its process when one failed (timeout, error, or a judge's
    unparseable verdict) on more than ``max_fraction`` of the batch's samples (rows: reward_status
    and reward_parts of each)."""
    counts: dict[str, int] = {}
    for r in rows:
        parts = r["reward_parts"] or {"verifier": 0.0, "verifier_status": r["reward_status"]}
        for key, status in parts.items():
            if key.endswith("_status") and status in ("timeout", "error", "parse_error"):
                counts[key[: -len("_status")]] = counts.get(key[: -len("_status")], 0) + 1
    for part, n in counts.items():
        if n > max_fraction * len(rows):
            where = (f"the {SERVED_BY[part]} process (see logs/{SERVED_BY[part]}.log)"
                     if part in SERVED_BY
                     else "the rollout workers' reward pools (see logs/rollout-*.log)")
            raise RewardFailed(f"reward part {part} failed (timeout, error or unparseable verdict) "
                               f"on {n} of the {len(rows)} samples of step {step}, more than "
                               f"reward.max_error_fraction={max_fraction:g}: {where}")


def _append(path: Path, obj: dict) -> None:
    append_jsonl(path, [obj])


def zero_nonfinite_rewards(g: GroupResult) -> int:
    """Score 0 (status "nonfinite") every sample of ``g`` whose reward is NaN or infinite, so it
    trains as a wrong answer instead of turning the model into NaN; returns how many."""
    n = 0
    for s in g.samples:
        if not math.isfinite(float(s.reward)):
            s.reward, s.reward_status, n = 0.0, "nonfinite", n + 1
    return n


def sample_tokens(s) -> dict:
    """A sample's tokens as trained (logging.trajectory_tokens): ids, behaviour logprobs, versions
    and loss mask, one entry per output token."""
    return {"prompt_ids": s.prompt_ids.tolist(), "output_ids": s.output_ids.tolist(),
            "logprobs": [float(x) for x in s.logprobs], "versions": s.versions.tolist(),
            "loss_mask": s.loss_mask.tolist()}


AGENT_COUNTS = ("agent_episodes", "agent_failed", "agent_calls", "agent_trajectories",
                "agent_splits",
                "agent_tool_calls", "tool_parse_errors", "agent_unauthorized", "agent_bad_requests",
                "agent_unattributed_calls", "agent_refused_large", "agent_disconnected",
                "agent_refused_connections", "agent_refused_unattributed", "agent_slow_requests",
                "agent_rerouted_calls")


AGENT_TIMES = ("agent_wait_s", "agent_engine_s", "agent_own_s")
"""Where an episode's wall time went, as means per episode that ran: waiting for a free
``agent_concurrency`` slot after its group arrived, with a call in the engine (queued or
generating), and the rest (the agent's code, its tools, the HTTP round trips)."""


def agent_row(c: Counter) -> dict:
    """workflow=agent's counts since the last step as metrics: sums, the agent's own logged
    numbers (``agent_extra_*``) as means per episode, and ``AGENT_TIMES`` as means per episode."""
    c = dict(c)
    episodes = max(1.0, c.get("agent_episodes", 0.0))
    timed = max(1.0, c.pop("agent_timed", 0.0))
    # every key on every step, also one in which no episode ended
    row = dict.fromkeys(AGENT_COUNTS + AGENT_TIMES, 0.0)
    row.update({k: (v / episodes if k.startswith("agent_extra_") else
                    v / timed if k in AGENT_TIMES else v) for k, v in c.items()})
    return dict(sorted(row.items()))


class StepRecorder:
    def __init__(self, run_dir: Path, cfg: RootConfig):
        self.run_dir, self.rd, self.cfg = run_dir, RunDir(run_dir), cfg
        self.t0 = time.monotonic()
        self.last_step_t = self.t0
        self.gen_tokens = 0  # generated since the last step
        self.gen_tokens_total = 0  # generated since this controller started
        self.filtered_groups = 0
        self.stale_dropped = 0
        # groups their worker stopped mid-generation, as too stale for any batch
        self.stale_stopped = 0
        # model tokens of both kinds of groups: generated, never trained
        self.stale_dropped_tokens = 0
        # of them, those dropped before this controller started (a resume)
        self.stale_tokens_at_start = 0
        self.batches: dict[int, dict] = {}  # step → batch summary, until its step is done
        self.arrived: dict[int, float] = {}  # group_id → wall time its result arrived
        # weight-update pauses the rollout workers reported since the last step
        self.pauses: list[float] = []
        self.samples: dict[int, list[list]] = {}  # step → its sample table, until its step is done
        self.tracking = None  # a tracking.fanout.TrackerFanout, once the controller opens one
        # workflow=agent: GroupResult.counters summed since the last step
        self.window: Counter = Counter()
        self.stale_warned = False  # said that much generation went to groups dropped as too stale

    def on_group(self, g: GroupResult) -> None:
        self.gen_tokens += g.gen_tokens
        self.gen_tokens_total += g.gen_tokens
        self.arrived[g.group_id] = time.monotonic() - self.t0

    def on_stale_stopped(self, g: GroupResult) -> None:
        self.gen_tokens += g.gen_tokens
        self.gen_tokens_total += g.gen_tokens
        self.stale_stopped += 1
        self.stale_dropped_tokens += g.gen_tokens

    def on_counters(self, counters: dict) -> None:
        self.window.update(counters)

    def on_batch(self, step: int, groups: list[GroupResult],
                 prompts: dict[int, str] | None = None) -> None:
        """``prompts``: group_id → prompt text, for the trackers' sample tables."""
        rows, staleness = [], []
        for g in groups:
            for s in g.samples:
                model = s.loss_mask.astype(bool)
                vs = s.versions[model]
                start, end = (int(vs[0]), int(vs[-1])) if len(vs) else (step, step)
                staleness.append(step - start)
                rows.append({
                    "prompt_id": g.prompt_id, "sample_index": int(s.sample_index),
                    "group_id": g.group_id,
                    "episode": int(s.episode if s.episode >= 0 else s.sample_index),
                    "version_start": start, "version_end": end, "trained_version": step,
                    "reward": float(s.reward), "num_tokens": int(model.sum()),
                    "finish_reason": s.finish_reason,
                    "num_turns": int(s.num_turns), "reward_status": s.reward_status,
                    "worker": g.worker,
                    "completion": s.completion[-300:], "gen_time_s": g.gen_time_s,
                    "done_wall_s": self.arrived.get(g.group_id),
                    "reward_parts": dict(s.reward_parts),
                    **(sample_tokens(s) if self.cfg.logging.trajectory_tokens else {}),
                })
        for g in groups:
            self.arrived.pop(g.group_id, None)
        append_jsonl(self.rd.trajectories, rows)
        every = self.cfg.logging.samples_every
        if every and step % every == 0:
            self.samples[step] = [
                [step, r["prompt_id"], (prompts or {}).get(r["group_id"], ""), r["completion"],
                 r["reward"],
                 r["num_tokens"], r["finish_reason"], step - r["version_start"]]
                for r in rows[: self.cfg.logging.samples]]
        self.batches[step] = {
            "reward_mean": float(np.mean([r["reward"] for r in rows])),
            "staleness_max": int(max(staleness)), "staleness_mean": float(np.mean(staleness)),
            "response_length_mean": float(np.mean([r["num_tokens"] for r in rows])),
            "reward_timeouts": sum(r["reward_status"] == "timeout" for r in rows),
            "reward_errors": sum(r["reward_status"] == "error" for r in rows),
            "reward_nonfinite": sum(r["reward_status"] == "nonfinite" for r in rows),
            "truncated_fraction": float(np.mean([r["finish_reason"] == "length" for r in rows])),
            **part_metrics(rows),
        }

    def stale_waste(self) -> float:
        """The share of the tokens generated since this controller started that belonged to groups
        dropped as too stale (0 before any)."""
        dropped = self.stale_dropped_tokens - self.stale_tokens_at_start
        return dropped / self.gen_tokens_total if self.gen_tokens_total else 0.0

    def warn_stale_waste(self, version: int, log) -> None:
        """Say once (from the fifth step) when more than ``STALE_WASTE_WARN`` of the generated
        tokens were of groups dropped as too stale: generation then works largely for nothing, and
        the fix is in the config."""
        waste = self.stale_waste()
        if self.stale_warned or version < 5 or waste <= STALE_WASTE_WARN:
            return
        self.stale_warned = True
        eta = self.cfg.rollout.max_staleness
        log.warning("%.0f%% of the tokens generated so far were of groups dropped as older than "
                    "rollout.max_staleness=%d versions when their batch came (%d groups, "
                    "stale_dropped in metrics.jsonl): their first token came more than %d training "
                    "steps before the step that would train them, and the generation was wasted. "
                    "Raise rollout.max_staleness, or trainer.batch_size (longer steps), or lower "
                    "rollout.max_new_tokens (shorter long tails)",
                    100 * waste, eta, self.stale_dropped, eta)

    def on_step_done(self, step: int, trainer: dict, pool: dict) -> dict:
        now = time.monotonic()
        row = {"step": step, "version": step + 1}
        row.update(self.batches.pop(step, {}))
        row.update(trainer)
        row.update({
            "gen_tokens_per_s": self.gen_tokens / max(now - self.last_step_t, 1e-9),
            "wall_time_s": now - self.t0,
            "step_wall_s": now - self.last_step_t,
            "filtered_groups": self.filtered_groups,
            "stale_dropped": self.stale_dropped,
            "stale_stopped": self.stale_stopped,
            "stale_dropped_tokens": self.stale_dropped_tokens,
            **{f"pool_{k}": v for k, v in pool.items()},
        })
        if workflow_spec(self.cfg.workflow.name).runs_agent:
            row.update(agent_row(self.window))
        self.window = Counter()
        if self.pauses:  # mostly the update that followed the previous step
            row["weight_pause_s"] = max(self.pauses)
        self.gen_tokens, self.last_step_t, self.pauses = 0, now, []
        samples = self.samples.pop(step, None)
        row["log_s"] = self.tracking.log_step(row, samples) if self.tracking else 0.0
        _append(self.rd.metrics, row)
        return row

    def on_weights_loaded(self, worker: str, version: int, timings: dict) -> None:
        if isinstance(timings.get("pause_total_s"), (int, float)):
            self.pauses.append(float(timings["pause_total_s"]))
        _append(self.rd.weight_updates, {"worker": worker, "version": version, **timings})

"""The allowed range of every numeric setting, checked on load over the whole config tree.

``check_ranges(cfg)`` walks the dataclasses of a config: every int/float field must be finite
(NaN and inf are refused everywhere) and lie in its class's range in ``RANGES``; every problem is
reported at once as ``key=value: must be in [lo, hi] (what it is)``. A numeric field missing from
``RANGES`` is a bug caught by tests/config/test_ranges.py. No torch import here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, is_dataclass

INF = math.inf
SEED_MAX = 2**31 - 1
WAIT_MAX_S = (2**31 - 1) // 1000
"""The longest wait in seconds: ZeroMQ's poll and select.poll take int32 milliseconds (about 24.8
days); a longer one raises OverflowError in the process at its first wait."""
INDEX_MAX = 2**31 - 1
"""The most tokens of a KV cache or an engine batch: transformers' paged cache and batch buffers
index tokens with int32."""
THREADS_MAX = 1024
"""The most torch CPU threads of a process: more than any machine's cores (the launcher holds a
local run to this machine's)."""


@dataclass(frozen=True)
class Range:
    lo: float
    hi: float = INF
    lo_open: bool = False  # (lo, ...: lo itself is refused
    hi_open: bool = False
    note: str = ""  # what the value means at the edges, e.g. "0 = auto"

    def holds(self, v: float) -> bool:
        above = v > self.lo if self.lo_open else v >= self.lo
        below = v < self.hi if self.hi_open else v <= self.hi
        return above and below

    def __str__(self) -> str:
        hi = "inf)" if self.hi == INF else f"{_num(self.hi)}{')' if self.hi_open else ']'}"
        return f"{'(' if self.lo_open else '['}{_num(self.lo)}, {hi}" + (f" ({self.note})"
                                                                         if self.note else "")


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def pos(note: str = "") -> Range:
    """> 0."""
    return Range(0, lo_open=True, note=note)


def at_least(lo: float, note: str = "") -> Range:
    return Range(lo, note=note)


AUTO0 = at_least(0, "0 = auto")
COUNT = at_least(1)
FRACTION = Range(0, 1)
PROB = Range(0, 1, lo_open=True)
SEED = Range(0, SEED_MAX)
TIMEOUT = Range(0, WAIT_MAX_S, lo_open=True, note="seconds")
THREADS = Range(0, THREADS_MAX, note="0 = auto")


def seconds(note: str = "seconds") -> Range:
    """[0, WAIT_MAX_S]: a wait that may be 0."""
    return Range(0, WAIT_MAX_S, note=note)


# class name → field → Range. Class names, not paths: TaskConfig/RewardConfig/EngineConfig are
# shared by `areal train` and `areal eval`.
RANGES: dict[str, dict[str, Range]] = {
    "RootConfig": {"seed": SEED},
    "TaskConfig": {"size": at_least(0, "0 = all"), "eval_size": at_least(0), "seed": SEED,
                   "eval_share": Range(0, 1, True, True), "eval_fraction": Range(0, 1, True, True)},
    "RewardConfig": {
        "timeout_s": TIMEOUT, "workers": Range(1, 256), "numeric_tol": at_least(0),
        "code_cpu_s": Range(1, WAIT_MAX_S, note="seconds"), "code_wall_s": TIMEOUT,
        "code_mem_mb": at_least(16), "code_nproc": COUNT,
        "max_error_fraction": Range(0, 1, note="1 = never stop"), "batch_size": COUNT,
        "batch_wait_s": seconds(),  # also below timeout_s (runconfig/bounds.py)
    },
    "RewardModelConfig": {"max_tokens": COUNT},
    "JudgeConfig": {"score_min": Range(-INF), "score_max": Range(-INF),
                    "max_new_tokens": Range(1, 256),
                    "min_verdict_mass": FRACTION, "max_tokens": COUNT,
                    "gpu_memory_utilization": PROB},
    "AlgorithmConfig": {
        "gamma": FRACTION, "lam": FRACTION,
        "eps_clip_low": Range(0, 1, lo_open=True, note="1 = no lower bound"),
        "eps_clip_high": pos(), "dual_clip": Range(1, lo_open=True, note="or null = off"),
        "behav_weight_cap": at_least(1), "behav_mask_low": Range(0, 1, note="or null = off"),
        "behav_mask_high": at_least(1, "or null = off"), "kl_coef": at_least(0, "0 = off"),
        "entropy_coef": at_least(0, "0 = off"), "overlong_buffer": at_least(0, "0 = off"),
        "overlong_penalty": at_least(0), "value_coef": at_least(0),
        "router_aux_loss_coef": at_least(0, "0 = off"),
        "value_clip": pos("or null = unclipped"),
        "critic_lr": Range(0, 1, lo_open=True), "ppo_epochs": COUNT,
    },
    "EngineConfig": {  # token counts past INDEX_MAX overflow the engine's int32 indices
        "max_batch_tokens": Range(1, INDEX_MAX),
        "kv_cache_tokens": Range(0, INDEX_MAX, note="0 = what the run needs"),
        "page_size": Range(1, 4096), "threads": THREADS, "gpu_memory_utilization": PROB,
    },
    "VLLMConfig": {"tensor_parallel_size": COUNT, "max_model_len": AUTO0, "max_num_seqs": AUTO0},
    "WorkflowConfig": {"max_turns": COUNT, "turn_discount": FRACTION,
                       "agent_concurrency": Range(0, 4096),
                       "agent_processes": Range(-1, 64, note="-1 = auto, 0 = none"),
                       "agent_timeout_s": TIMEOUT, "max_failed_fraction": FRACTION,
                       "agent_wall_timeout_s": Range(0, WAIT_MAX_S, note="seconds; 0 = none"),
                       "agent_memory_mb": Range(0, 1 << 30, note="MiB; 0 = no limit"),
                       # connections: a worker process holds ~20,000 file descriptors
                       "agent_max_connections": Range(1, 16384),
                       "agent_idle_timeout_s": Range(0.1, 3600),
                       "agent_max_body_mb": Range(0.01, 1024),
                       "agent_unattributed_sequences": Range(0, 4096)},
    "RolloutConfig": {
        "workers": COUNT, "group_size": COUNT, "max_new_tokens": COUNT,
        "max_staleness": at_least(0, "0 = synchronous"),
        "max_concurrent": at_least(0, "0 = (η+1)·batch_size"),
        "temperature": pos(), "top_p": PROB,
    },
    "TrainerConfig": {
        "ranks": COUNT, "steps": COUNT, "batch_size": COUNT, "lr": Range(0, 1, lo_open=True),
        "weight_decay": at_least(0), "warmup_steps": at_least(0), "min_lr_ratio": FRACTION,
        "grad_clip": pos("the max gradient norm"),
        "micro_batch_tokens": COUNT, "threads": THREADS, "logprob_chunk_tokens": AUTO0,
        "checkpoint_every": COUNT,
        "peak_flops": at_least(0, "FLOP/s; 0 = from the card"),
        "max_nonfinite_steps": at_least(0, "0 = never stop"),
        "shape_buckets": Range(0, 64, note="sizes per doubling; 0 = exact shapes"),
    },
    "LoraConfig": {"rank": at_least(0, "0 = full fine-tuning"), "alpha": pos(),
                   "dropout": Range(0, 1, hi_open=True)},
    "WeightsConfig": {"bucket_mb": at_least(0, "0 = 1024 with NCCL, 32 with gloo")},
    "LauncherConfig": {
        "port_base": Range(0, 65535 - 6, note="0 = free ports; the run uses 7 from it"),
        # a beat more often than every 0.1 s only floods the controller's socket and the GIL
        "heartbeat_s": Range(0.1, WAIT_MAX_S, note="seconds"), "peer_timeout_s": TIMEOUT,
        "startup_timeout_s": TIMEOUT, "progress_timeout_s": seconds("seconds; 0 = never"),
        "stop_timeout_s": seconds(),
        "nodes": COUNT, "gpus_per_node": at_least(0), "gen_nodes": at_least(0, "0 = half"),
        "signal_s": Range(0, 65535, note="seconds; Slurm's --signal takes at most 65535"),
        "max_frame_mb": Range(0, 2047, note="0 = sized to the largest batch"),
    },
    "CheckpointConfig": {"every": at_least(0, "0 = only at the end"),
                         "keep": at_least(0, "0 = all")},
    "EvalConfig": {"every": at_least(0, "0 = never"), "size": at_least(0)},
    "LoggingConfig": {"samples_every": at_least(0, "0 = never"), "samples": COUNT},
    "EvalRunConfig": {
        "n_samples": COUNT, "temperature": at_least(0, "0 = greedy"), "top_p": PROB,
        "max_new_tokens": COUNT,
        "size": at_least(0, "0 = all"), "seed": SEED, "threads": THREADS, "max_concurrent": COUNT,
        "workers": AUTO0, "timeout_s": seconds("seconds; 0 = no limit"),
    },
}


def numeric_fields(cfg, prefix: str = ""):
    """(dotted key, class name, field name, value) of every int/float field under ``cfg``."""
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if is_dataclass(v):
            yield from numeric_fields(v, f"{prefix}{f.name}.")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield f"{prefix}{f.name}", type(cfg).__name__, f.name, v


def check_ranges(cfg) -> list[str]:
    """Every numeric setting of ``cfg`` that is not finite or outside its range, as a problem."""
    out = []
    for key, cls, name, v in numeric_fields(cfg):
        r = RANGES.get(cls, {}).get(name)
        if not math.isfinite(v):
            out.append(f"{key}={v}: must be a finite number" + (f" in {r}" if r else ""))
        elif r is not None and not r.holds(v):
            out.append(f"{key}={v}: must be in {r}")
    return out


def drop_repeats(generic: list[str], specific: list[str]) -> list[str]:
    """``specific`` problems less those about a key that ``generic`` already reports."""
    keys = {p.split("=", 1)[0] for p in generic}
    return [p for p in specific if p.split("=", 1)[0].split(" ", 1)[0] not in keys]

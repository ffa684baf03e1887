"""Generation alone, for the ideal of ``areal bench sync-vs-async``.

    python -m areal_cli.bench.alone RUN_DIR OUT.json [GROUPS] [LOAD]

One rollout worker's engine built exactly as in the run of RUN_DIR (its resolved ``config.yaml``:
engine, sampling, KV cache, length profile) on the GPUs that worker had, generating the task's
training prompts with that worker's concurrency (``worker_concurrency`` groups of
``rollout.group_size`` sequences in flight, refilled as each group completes): no trainer, no
weight update, no reward. The first ``worker_concurrency`` completed groups are warm-up; the rate is
the generated tokens of the groups completed after them over the seconds they took, and
``sequences_held_mean`` the unfinished sequences the engine held on average meanwhile (the rollout
worker's "generation:" log line counts the same way). GROUPS (default
3 × the concurrency, at least 8) completed groups end the measurement, or ``LIMIT_S`` seconds.

The bench runs it after the asynchronous run (its concurrency is the larger one) and multiplies the
rate by rollout.workers (workers are independent engines on GPUs of their own). LOAD: the groups one
worker of the asynchronous run actually held on average (the staleness bound admits fewer than the
configured concurrency while batches wait for the trainer); where it is lower, the same engine is
first measured at that load (``at_async_load``): the engine's own speed at the load the run gave it,
against which the run's generation shows what the system costs the engine.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

LIMIT_S = 600.0
"""The measurement stops here even if fewer groups completed."""


def measure(run_dir: Path, groups: int = 0, load: int = 0) -> dict:
    """Generation alone at the run's configured concurrency; first at ``load`` groups as well where
    0 < ``load`` < that (``at_async_load``), with the same engine."""
    from areal_cli.config.read import read_yaml
    from areal_cli.config.schema import worker_concurrency
    from areal_cli.engines.base import EngineSetup, Sampling
    from areal_cli.engines.factory import make_engine
    from areal_cli.model_source import resolve_model
    from areal_cli.rundir import RunDir
    from areal_cli.tasks import load_problems, load_tokenizer
    from areal_cli.tasks.tokens import prompt_ids
    from areal_cli.workflows.length_profile import load_profile

    cfg = read_yaml(RunDir(run_dir).config)
    model = resolve_model(cfg.model)
    tok = load_tokenizer(model)
    capacity, g = worker_concurrency(cfg), cfg.rollout.group_size
    groups = groups or max(8, 3 * capacity)
    problems = [prompt_ids(tok, p, cfg.task) for p in load_problems(cfg.task, "train")]
    context = max(len(p) for p in problems) + cfg.rollout.max_new_tokens + 128
    engine = make_engine(EngineSetup(cfg.engine, model, tok.eos_token_id,
                                     Sampling(cfg.rollout.temperature,
                                     cfg.rollout.top_p), sequences=capacity * g, context=context,
                                     seed=cfg.seed))
    lengths = load_profile(cfg.rollout.length_profile, cfg.seed)
    first = {}
    if 0 < load < capacity:
        first = {"at_async_load": _measure(engine, problems, lengths, cfg, load,
                                           groups or max(8, 3 * load), 10**6)}
    out = _measure(engine, problems, lengths, cfg, capacity, groups, 0)
    engine.close()
    return {**out, **first}


def _measure(engine, problems: list, lengths, cfg, capacity: int, groups: int,
             first_group: int) -> dict:
    """``capacity`` groups in flight, refilled as each completes, until ``capacity`` (warm-up) +
    ``groups`` complete; group ids from ``first_group`` (length draws of their own). Sequences a
    measurement before left in the engine finish during the warm-up and are not counted."""
    from areal_cli.engines.base import Sequence

    g = cfg.rollout.group_size
    left: dict[int, int] = {}  # group → sequences not finished
    made: dict[int, int] = {}  # group → generated tokens
    done: list[tuple[float, int]] = []  # (completion time, generated tokens) per group
    started, t0 = 0, time.perf_counter()

    def start() -> None:
        nonlocal started
        ids, gid = problems[started % len(problems)], first_group + started
        left[gid], made[gid], started = g, 0, started + 1
        for i in range(g):
            cap = cfg.rollout.max_new_tokens
            n = cap if lengths is None else lengths.draw(cap, f"{gid}-{i}")
            engine.submit(Sequence((gid, i), list(ids), n, ignore_eos=lengths is not None))

    # sequence-seconds in the engine after warm-up, and since when
    held_s, measured_from = 0.0, None
    while len(done) < capacity + groups and time.perf_counter() - t0 < LIMIT_S:
        while len(left) < capacity:
            start()
        held, before = engine.in_flight(), time.perf_counter()
        finished = engine.poll(0.05)
        if measured_from is not None:
            held_s += held * (time.perf_counter() - before)
        for seq in finished:
            gid = seq.rid[0]
            if gid not in made:
                continue  # a group of the measurement before (its last sequences)
            made[gid] += len(seq.output_ids)
            left[gid] -= 1
            if left[gid] == 0:
                del left[gid]
                done.append((time.perf_counter(), made.pop(gid)))
                if len(done) == capacity:
                    measured_from = done[-1][0]
    measured = done[capacity:]
    if len(done) <= capacity or not measured:
        raise RuntimeError(f"generation alone: {len(done)} groups completed in {LIMIT_S:.0f} s, "
                           f"not more than the {capacity} of warm-up")
    seconds = measured[-1][0] - done[capacity - 1][0]
    tokens = sum(n for _, n in measured)
    return {"generated_tokens_per_s": tokens / seconds, "groups": len(measured),
            "warmup_groups": capacity,
            "concurrency_groups": capacity, "sequences_in_flight": capacity * g, "seconds": seconds,
            "generated_tokens": tokens, "sequences_held_mean": held_s / max(seconds, 1e-9)}


def pick_split(gen_per_gpu: float, train_per_gpu: float, gpus: int, step: int) -> dict | None:
    """The generation / trainer GPU split of ``gpus`` (generation in multiples of ``step``, the
    tensor parallel size; at least one GPU each) whose min(generation, training) rate is highest,
    both sides assumed to scale linearly from their per-GPU rates; None with fewer than two GPUs."""
    best = None
    for gen in range(step, gpus, step):
        rate = min(gen * gen_per_gpu, (gpus - gen) * train_per_gpu)
        if best is None or rate > best["ideal_trained_tokens_per_s"]:
            best = {"generation_gpus": gen, "trainer_gpus": gpus - gen,
                    "ideal_trained_tokens_per_s": rate}
    return best


def main() -> None:
    run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    groups = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    load = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    out.write_text(json.dumps(measure(run_dir, groups, load), indent=1))


if __name__ == "__main__":
    main()

"""``areal bench sync-vs-async``: the same workload synchronously (η = 0) and asynchronously (η).

Both runs use one config (conf/ + the overrides) and differ only in ``rollout.max_staleness``.
Written to ``<out>/``: ``sync/`` and ``async/`` (ordinary run directories), ``bench.json``,
``timeline.png`` (per run: generation, training and weight-sync spans over wall time; white is
idle) and ``reward.png`` (mean reward of each batch against wall time).

The ideal asynchronous throughput is min(generation alone, training alone), in trained tokens
per second, both measured in the same call:

* generation alone = one rollout worker's engine, configured as in the async run, on that worker's
  GPUs, generating the task's prompts at the async run's concurrency with no trainer
  (``bench/alone.py``), × rollout.workers (on GPUs; one worker's rate on the CPU, whose cores
  the workers share). Generated tokens are the tokens a step trains (the model's tokens);
* training alone = the async run's own trained tokens / trainer-busy seconds
  (``step_time_s + weight_sync_s``), steps after warm-up: the same batches, on the trainer's GPUs,
  which generation never uses.

``async_vs_ideal`` = the async run's effective trained tokens/s of wall time / that ideal; above
1.02 it is a measurement error (reported so), never a success. ``generation_in_system_fraction``:
the async run's generated tokens per second of its window / generation alone (and
``generation_in_system_with_dropped_fraction``, counting too the groups generated and then dropped
as too stale: what the engine made, trained or not). The same engine is also measured alone at the
load the async run gave it (its mean running groups per worker, which the staleness bound keeps
below the configured concurrency), and both fractions are set against that too
(``..._at_load_fraction``): what the system costs the engine at equal load. From the two
per-GPU rates the bench prints the generation / trainer GPU split it would pick. The sync run's
own split of step time (``summary.standalone_rates``) is kept under ``sync_phases``.
Each mode also gets its response length distribution (generated tokens per trained sample
after warm-up: p10 / p50 / p90 / max, and the fraction truncated at max_new_tokens).
``bench.json`` repeats these definitions under ``"definitions"``.

Bench options are overrides too, stripped before composing the run config:
``bench.eta=4`` (default: rollout.max_staleness, or 4 where that is 0), ``bench.warmup=2``
(steps left out of the rates), ``bench.heldout=true`` (greedy accuracy of both final
checkpoints on the task's eval split), ``bench.heldout_size=1000`` (problems of that split, so that
a gap of a few points is not lost in the noise of a small set; 0 = ``eval.size``; a split that
cannot hold that many falls back to ``eval.size``), ``bench.alone=true`` (measure generation alone;
false: no ideal), ``bench.alone_groups=0`` (groups it measures after warm-up; 0 = 3 × the worker's
concurrency, at least 8), ``bench.modes=sync,async`` (the modes to run in this call). ``run_dir=``
names ``<out>``. Take ``trainer.steps`` ≥ ``bench.warmup`` + 30 so that each mode measures at least
30 steps.

A mode that finished is kept: ``<out>/<mode>.json`` records its summary with the overrides and bench
options it ran with, and the same command run again uses it instead of running it again (remove
``<out>/<mode>/`` and ``<out>/<mode>.json`` to measure it anew). So the bench can run one mode per
call (``bench.modes=sync``, then the same command with ``bench.modes=async``, which compares), and a
bench stopped in its second mode loses only that one. Generation alone is kept the same way
(``generation_alone.json``, for the async run it measured), so a call stopped in the comparison
loses only what it had not finished. A mode's run directory left unfinished is
moved aside (``<mode>.unfinished-<time>``) before it runs again.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

from areal_cli.bench.report import MEASUREMENT_ERROR, plot, report, step_speedup
from areal_cli.rundir import RunDir

BENCH_DEFAULTS = {"eta": None, "warmup": 2, "heldout": True, "heldout_size": 1000, "alone": True,
                  "alone_groups": 0, "modes": "sync,async"}
MODES = ("sync", "async")
def split_overrides(overrides: list[str]) -> tuple[list[str], dict]:
    """(run overrides, bench options) from the command line."""
    run, opts = [], dict(BENCH_DEFAULTS)
    for o in overrides:
        key, _, value = o.partition("=")
        if not key.startswith("bench."):
            run.append(o)
            continue
        name = key.removeprefix("bench.")
        if name not in BENCH_DEFAULTS:
            raise ValueError(f"{key}: unknown bench option; use one of "
                             f"{', '.join('bench.' + k for k in BENCH_DEFAULTS)}")
        if name == "modes":
            chosen = [m.strip() for m in value.split(",") if m.strip()]
            if not chosen or not set(chosen) <= set(MODES):
                raise ValueError(f"bench.modes={value}: name sync, async or both (sync,async)")
            opts[name] = ",".join(m for m in MODES if m in chosen)
            continue
        opts[name] = (value.lower() in ("1", "true", "yes") if name in ("heldout", "alone")
                      else int(value))
    return run, opts


def run_bench(overrides: list[str]) -> Path:
    from areal_cli.runconfig.compose import compose

    run_overrides, opts = split_overrides(list(overrides))
    base = compose(run_overrides)
    eta = opts["eta"] if opts["eta"] is not None else (base.rollout.max_staleness or 4)
    if eta < 1:
        raise ValueError("bench.eta must be at least 1 (η = 0 is the synchronous run it is "
                         "compared with)")
    out = Path(base.run_dir or f"runs/bench-{_dt.datetime.now():%Y%m%d-%H%M%S}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    modes = {}
    for mode, staleness in zip(MODES, (0, eta), strict=True):
        run_dir = out / mode
        kept = kept_mode(out, mode, run_overrides, staleness, opts)
        if kept is not None:
            print(f"== {mode}: finished already in {run_dir}, kept (remove {run_dir} and "
                  f"{mode}.json beside it to measure it again)", flush=True)
            modes[mode] = kept
            continue
        if mode not in opts["modes"].split(","):
            continue
        if run_dir.exists():  # a run stopped before its end: its figures would mix two starts
            aside = run_dir.with_name(f"{mode}.unfinished-{_dt.datetime.now():%Y%m%d-%H%M%S}")
            run_dir.rename(aside)
            print(f"== {mode}: {run_dir} did not finish; moved aside to {aside.name}", flush=True)
        print(f"== {mode}: rollout.max_staleness={staleness} → {run_dir}", flush=True)
        modes[mode] = run_mode(run_overrides, staleness, run_dir, opts)
        record = {"overrides": run_overrides, "staleness": staleness,
                  "options": _recorded(opts), "summary": modes[mode]}
        (out / f"{mode}.json").write_text(json.dumps(record, indent=1))
    if len(modes) < len(MODES):
        missing = [m for m in MODES if m not in modes]
        print(f"== measured: {', '.join(modes) or 'nothing'}; run the same command with "
              f"bench.modes={','.join(missing)} for the rest and the comparison", flush=True)
        return out
    alone = generation_alone(Path(modes["async"]["run_dir"]), out / "generation_alone.json",
                             opts["alone_groups"],
                             modes["async"].get("running_groups_mean")) if opts["alone"] else None
    result = compare(modes, eta, opts["warmup"], base, alone)
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    plot(result, out)
    from areal_cli.tracking.plot import plot_runs

    # both runs against step and wall time
    plot_runs([out / mode for mode in modes], out / "curves.png")
    print(report(result), flush=True)
    return out


def _recorded(opts: dict) -> dict:
    """The bench options a mode's figures depend on (not which modes a call runs)."""
    return {k: v for k, v in opts.items() if k in ("warmup", "heldout", "heldout_size")}


def kept_mode(out: Path, mode: str, overrides: list[str], staleness: int,
              opts: dict) -> dict | None:
    """The summary of ``mode`` from an earlier call of the same bench (same overrides, staleness
    and options; its run directory still there), else None."""
    path = out / f"{mode}.json"
    if not path.is_file() or not (out / mode / "metrics.jsonl").is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    same = (record.get("overrides") == overrides and record.get("staleness") == staleness
            and record.get("options") == _recorded(opts))
    if not same:
        print(f"== {mode}: {path.name} is of another command (other overrides or bench options): "
              "measured again", flush=True)
        path.unlink()
        return None
    return record.get("summary")


def run_mode(overrides: list[str], staleness: int, run_dir: Path, opts: dict) -> dict:
    from areal_cli.bench.summary import summarize_run
    from areal_cli.launcher.run import train
    from areal_cli.runconfig.compose import compose

    # the bench measures held-out accuracy itself (bench.heldout), not with the closing evaluation
    cfg = compose(overrides
                  + [f"rollout.max_staleness={staleness}", f"run_dir={run_dir}",
                     "eval.at_end=false"])
    train(cfg, quiet=True)
    summary = summarize_run(run_dir, opts["warmup"])
    summary["max_staleness"] = staleness
    if opts["heldout"]:
        summary["heldout"] = heldout(RunDir(run_dir).final, cfg, opts["heldout_size"])
    return summary


def generation_alone(run_dir: Path, out: Path, groups: int, running: float | None = None) -> dict:
    """``bench/alone.py`` on the GPUs of ``run_dir``'s rollout worker 0, in a process of its own (as
    the worker had); its rate × the workers it stands for (``scale``: rollout.workers on GPUs, 1 on
    the CPU).
    ``running``: the groups the run held at once on average (all workers), for the measurement at
    its load."""
    import os
    import subprocess
    import sys

    from areal_cli.config.read import read_yaml
    from areal_cli.launcher.devices import device_map, worker_gpus
    from areal_cli.runtime import physical_gpus

    cfg = read_yaml(RunDir(run_dir).config)
    gpus = worker_gpus(cfg, device_map(cfg)["rollout"])[0]
    load = round(running / cfg.rollout.workers) if running else 0
    of = {"run_dir": str(run_dir), "groups": groups, "load": load,
          "run_finished": (run_dir / "metrics.jsonl").stat().st_mtime}
    got = _kept_alone(out, of)
    if got is None:
        env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": physical_gpus(gpus)} if gpus else {}))
        print(f"== generation alone: one worker's engine as in {run_dir.name}/ "
              f"({'GPUs ' + str(gpus) if gpus else 'CPU'})",
              flush=True)
        subprocess.run([sys.executable, "-m", "areal_cli.bench.alone", str(run_dir), str(out),
                        str(groups), str(load)],
                       env=env, check=True)
        got = json.loads(out.read_text())
        out.write_text(json.dumps({**got, "of": of}, indent=1))
    else:
        print(f"== generation alone: measured already for {run_dir.name}/, kept (remove {out.name} "
              "to measure it again)", flush=True)
    got["scale"] = cfg.rollout.workers if gpus else 1
    got["gpus_per_worker"] = len(gpus)
    return got


def _kept_alone(path: Path, of: dict) -> dict | None:
    """Generation alone measured by an earlier call for the same async run (``of``: its directory,
    when it finished, the groups and load asked), else None: a bench whose comparison did not
    finish measures only what it lacks."""
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return got if got.get("of") == of else None


def heldout(model_path: Path, cfg, size: int) -> dict:
    """Greedy accuracy of ``model_path`` on the first ``size`` problems of the eval split (0 or a
    split too small for them: ``eval.size``). Only the eval split grows: training never draws a
    held-out problem, whatever ``task.eval_size`` is."""
    import copy

    from areal_cli.bench.heldout import greedy_accuracy
    from areal_cli.tasks import load_problems

    if size > 0:
        wide = copy.deepcopy(cfg)
        wide.task.eval_size = max(size, cfg.task.eval_size)
        try:
            problems = load_problems(wide.task, "eval")
        except ValueError as e:
            print(f"bench: {size} held-out problems do not fit the eval split ({e}); "
                  f"using eval.size={cfg.eval.size}", flush=True)
        else:
            return greedy_accuracy(model_path, wide, size=size, problems=problems)
    return greedy_accuracy(model_path, cfg)


DEFINITIONS = {
    "effective_trained_tokens_per_s": "per mode: trained tokens of the steps after warm-up / wall "
        "seconds from the end of the last warm-up step to the end of the last step",
    "training_trained_tokens_per_s": "per mode: trained tokens / trainer-busy seconds (step_time_s "
        "+ weight_sync_s), steps after warm-up; the sync run's value is standalone training",
    "speedup": "async effective_trained_tokens_per_s / sync effective_trained_tokens_per_s",
    "step_speedup": "sync step_wall_s_median / async step_wall_s_median: the speedup in steps "
        "(policy versions) per second, which does not grow when the async run trains longer "
        "responses",
    "standalone.generation_trained_tokens_per_s": "generation alone, measured in the same call: "
        "one rollout worker's engine configured as in the async run (engine, sampling, lengths, "
        "its concurrency), on that worker's GPUs, no trainer: generated tokens/s of the groups "
        "completed after the first wave x rollout.workers on GPUs (1 on the CPU); bench/alone.py",
    "standalone.training_trained_tokens_per_s": "training alone: the async run's trained tokens / "
        "trainer-busy seconds (step_time_s + weight_sync_s), steps after warm-up: the same batches",
    "ideal_trained_tokens_per_s": "ideal asynchronous throughput: min(standalone generation, "
        "standalone training), trained tokens per second",
    "ideal_bottleneck": "the side that sets the ideal: generation or training",
    "async_vs_ideal": "async effective_trained_tokens_per_s / ideal_trained_tokens_per_s; above "
        "1.02 a measurement error (measurement_error true), not a success",
    "generation_in_system_fraction": "the async run's generated tokens of groups completed in its "
        "window / window seconds, over standalone generation",
    "generation_in_system_with_dropped_fraction": "the same, also counting the tokens of groups "
        "dropped as older than rollout.max_staleness, generated in full or stopped by their worker "
        "once no batch could take them (the stale_dropped_tokens metric over the window): what the "
        "engine produced, useful or not",
    "generation_in_system_at_load_fraction": "the async run's generated tokens/s over the same "
        "engine alone at the load that run gave it (async_running_groups_mean / rollout.workers "
        "groups at once, measured first in the same process as standalone generation): what the "
        "system costs the engine beyond the groups the staleness bound lets it hold",
    "generation_in_system_with_dropped_at_load_fraction": "the same, counting the groups dropped "
                                                          "as too stale",
    "async_running_groups_mean": "groups generating at once in the async run (all workers), the "
        "controller's count at each step's end (pool_running), steps after warm-up",
    "split": "the generation / trainer GPU split of the run's GPUs with the highest "
        "min(generation, training), each side scaled linearly from its measured per-GPU rate",
    "sync_phases": "the sync run's generation and training phases (summary.standalone_rates): its "
        "step time split, not a bound",
    "response_length": "per mode: generated tokens per trained sample (trajectories num_tokens; "
        "every model turn), steps after warm-up: p10 / p50 / p90 (nearest rank), max, mean, "
        "samples",
    "compiling_steps": "per mode: the steps whose trainer compiled graphs (metrics "
        "compiled_graphs: a form of input the trainer's precompile did not foresee), step -> "
        "graphs; such a step also waited for the compile",
    "response_length.truncated_fraction": "per mode: fraction of those samples stopped at the "
        "token limit (finish_reason == 'length', i.e. max_new_tokens)",
    "reward_reach": "the sync run's final mean reward (mean batch reward of its last quarter of "
        "steps, window_steps) and the first step of the async run whose mean over window_steps "
        "steps ending there reaches it: its wall_time_s and that / the sync run's wall time; "
        "heldout_gap_points = async - sync held-out greedy accuracy",
    "reward_wall_s": "per mode: wall_time_s of each step's end; reward.png plots reward_curve "
        "(mean reward of the step's batch) against it",
}


def compare(modes: dict, eta: int, warmup: int, cfg, alone: dict | None = None) -> dict:
    from areal_cli.bench.summary import reward_reach, standalone_rates

    sync, asyn = modes["sync"], modes["async"]
    speedup = asyn["effective_trained_tokens_per_s"] / max(sync["effective_trained_tokens_per_s"],
                                                           1e-9)
    sides = {"generation": alone["generated_tokens_per_s"] * alone["scale"] if alone else None,
             "training": asyn.get("training_trained_tokens_per_s")}
    ideal = bottleneck = ratio = fraction = with_dropped = split = None
    fraction_at_load = with_dropped_at_load = None
    if all(v is not None and v > 0 for v in sides.values()):
        bottleneck = min(sides, key=sides.get)
        ideal = sides[bottleneck]
        ratio = asyn["effective_trained_tokens_per_s"] / ideal
        # trained or not
        made = asyn["generated_tokens_per_s"] + asyn.get("stale_dropped_tokens_per_s", 0.0)
        fraction = asyn["generated_tokens_per_s"] / sides["generation"]
        with_dropped = made / sides["generation"]
        split = gpu_split(sides, alone, cfg)
        # the same, against the engine alone at the load the run gave it
        if "at_async_load" in alone:
            at_load = alone["at_async_load"]["generated_tokens_per_s"] * alone["scale"]
            fraction_at_load = asyn["generated_tokens_per_s"] / at_load
            with_dropped_at_load = made / at_load
    return {
        "eta": eta, "warmup_steps": warmup, "engine": cfg.engine.name, "model": str(cfg.model),
        "task": cfg.task.name, "steps": cfg.trainer.steps, "batch_size": cfg.trainer.batch_size,
        "group_size": cfg.rollout.group_size, "max_new_tokens": cfg.rollout.max_new_tokens,
        "speedup": speedup, "step_speedup": step_speedup(sync, asyn),
        "standalone": {"generation_trained_tokens_per_s": sides["generation"],
                       "training_trained_tokens_per_s": sides["training"],
                       "generation_alone": alone},
        "ideal_trained_tokens_per_s": ideal, "ideal_bottleneck": bottleneck,
        "async_vs_ideal": ratio,
        "measurement_error": ratio is not None and ratio > MEASUREMENT_ERROR,
        "generation_in_system_fraction": fraction,
        "generation_in_system_with_dropped_fraction": with_dropped,
        "generation_in_system_at_load_fraction": fraction_at_load,
        "generation_in_system_with_dropped_at_load_fraction": with_dropped_at_load,
        "async_running_groups_mean": asyn.get("running_groups_mean"),
        "split": split,
        "sync_phases": standalone_rates(Path(sync["run_dir"]), warmup),
        "reward_reach": reward_reach(sync, asyn), "definitions": DEFINITIONS, "modes": modes,
    }


def gpu_split(sides: dict, alone: dict, cfg) -> dict | None:
    """``alone.pick_split`` over the run's generation + trainer GPUs (None on the CPU)."""
    from areal_cli.bench.alone import pick_split

    gen_gpus = alone["scale"] * alone["gpus_per_worker"]
    if not gen_gpus:
        return None
    gpus = gen_gpus + cfg.trainer.ranks
    best = pick_split(sides["generation"] / gen_gpus, sides["training"] / cfg.trainer.ranks, gpus,
                      cfg.engine.vllm.tensor_parallel_size)
    return {**best,
            "now": {"generation_gpus": gen_gpus,
                    "trainer_gpus": cfg.trainer.ranks}} if best else None

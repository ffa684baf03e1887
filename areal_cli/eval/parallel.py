"""Data-parallel `areal eval`: one worker process per GPU (or per CPU share), one shard each.

The problems of every task are split into ``n`` contiguous shards; worker ``k`` (``python -m
areal_cli.eval.parallel <spec.json>``, CUDA_VISIBLE_DEVICES = its GPUs) composes the same
config from the same overrides, loads the same eval split, checks that its shard holds the
problem ids the parent gave it, evaluates every model on its shard of every task exactly as the
single-process path does (``sweep.evaluate_model``) and writes ``<out_dir>/shards/shard-<k>.json``.
The parent merges the samples in problem order and computes the metrics from all of them with
the same ``summarize``, so eval.json is what one process would have written (greedy decoding:
the same completions, up to floating-point ties that a different batch composition can flip).

Each worker's output goes to ``shards/shard-<k>.log`` and, prefixed, to stderr. A worker that
exits with an error stops the others at once and the parent names its shard, its GPUs and the
end of its log; so does a worker still running after ``timeout_s`` (its thread stacks are dumped
into its log first). A worker outlives nothing (it dies with the parent).
"""

from __future__ import annotations

import collections
import faulthandler
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from areal_cli.durable import atomic_write
from areal_cli.eval.metrics import summarize
from areal_cli.runtime import physical_gpus, usable_cores

PASSES = ("greedy", "sample")


class WorkerFailed(Exception):
    """A shard's worker died or wrote no result; the message names it."""


def shard_bounds(n_items: int, k: int, n: int) -> tuple[int, int]:
    """[start, end) of shard ``k`` of ``n`` contiguous, near-equal shards of ``n_items``."""
    return n_items * k // n, n_items * (k + 1) // n


def shard(items: list, k: int, n: int) -> list:
    start, end = shard_bounds(len(items), k, n)
    return items[start:end]


def device_label(gpus: list[int]) -> str:
    if not gpus:
        import torch

        return "the default GPU" if torch.cuda.is_available() else "CPU"
    return f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {','.join(map(str, gpus))}"


@dataclass
class _Worker:
    k: int
    gpus: list[int]
    proc: subprocess.Popen
    log: Path
    out: Path
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=25))
    reader: threading.Thread | None = None


def run_data_parallel(overrides: list[str], cfgs, models: list[tuple[str, Path]],
                      problems: list[list],
                      out_dir: Path, say=None) -> list[dict]:
    """Evaluate every model × task over ``cfgs[0].worker_count()`` workers; the merged results, in
    the order and with the keys of the single-process path."""
    head = cfgs[0]
    n = head.worker_count()
    shard_dir = out_dir / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    threads = head.threads or max(1, usable_cores() // n)
    workers = []
    try:
        for k in range(n):
            out = shard_dir / f"shard-{k}.json"
            out.unlink(missing_ok=True)
            spec = {"overrides": list(overrides), "shard": k, "shards": n, "out": str(out),
                    "models": [[name, str(path)] for name, path in models], "threads": threads,
                    "ids": [[p.id for p in shard(task_problems, k, n)]
                            for task_problems in problems]}
            spec_path = shard_dir / f"shard-{k}.spec.json"
            atomic_write(spec_path, json.dumps(spec))
            workers.append(_start(k, head.worker_gpus(k), spec_path, shard_dir / f"shard-{k}.log",
                                  out))
        if say:
            say(f"{n} workers: "
                + ", ".join(f"shard {w.k} on {device_label(w.gpus)} (pid {w.proc.pid})"
                                               for w in workers))
        _wait(workers, n, head.timeout_s)
    finally:
        _stop(workers)
    shards = [_read_shard(w, n) for w in workers]
    return merge(cfgs, models, problems, shards)


def _start(k: int, gpus: list[int], spec_path: Path, log: Path, out: Path) -> _Worker:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = physical_gpus(gpus)
    proc = subprocess.Popen([sys.executable, "-m", "areal_cli.eval.parallel", str(spec_path)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            # its own group: vLLM's children go with it
                            env=env, start_new_session=True)
    w = _Worker(k, gpus, proc, log, out)
    w.reader = threading.Thread(target=_pump, args=(w,), daemon=True, name=f"eval-shard-{k}")
    w.reader.start()
    return w


def _pump(w: _Worker) -> None:
    """The worker's output → its log file, the tail kept for an error, and stderr with a prefix.
    It cannot die before the worker's output ends: a worker whose pipe nobody reads blocks forever,
    so a log that cannot be written (a full disk) only loses the log."""
    prefix = f"[shard {w.k}] "
    try:
        log = open(w.log, "w", encoding="utf-8", errors="replace")
    except OSError as err:
        w.tail.append(f"(cannot write {w.log}: {err})")
        log = None
    for raw in iter(w.proc.stdout.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        w.tail.append(line)
        try:
            if log is not None:
                log.write(line + "\n")
                log.flush()
            print(prefix + line, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass  # keep draining the pipe
    if log is not None:
        try:
            log.close()
        except OSError:
            pass


def _wait(workers: list[_Worker], n: int, timeout_s: float = 0.0) -> None:
    """Until every worker exits; the first one that fails, or runs past ``timeout_s`` (0 = no
    limit), raises (the others are stopped after)."""
    running, start = list(workers), time.monotonic()
    while running:
        if timeout_s and time.monotonic() - start > timeout_s:
            late = [w for w in running if w.proc.poll() is None]
            _dump_stacks(late)
            raise WorkerFailed("\n".join(_failure(w, n, "still running after "
                                                           f"timeout_s={timeout_s:g}s (stuck? its "
                                                           "thread stacks are at the end of its "
                                                           "log)") for w in late))
        for w in list(running):
            rc = w.proc.poll()
            if rc is None:
                continue
            running.remove(w)
            if rc != 0:
                w.reader.join(timeout=5)
                raise WorkerFailed(_failure(w, n, _exit_text(rc)))
        time.sleep(0.2)


def _dump_stacks(workers: list[_Worker], wait_s: float = 2.0) -> None:
    """SIGUSR1: each worker writes every thread's stack to its output (see worker_main)."""
    for w in workers:
        try:
            os.kill(w.proc.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(wait_s)


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def _failure(w: _Worker, n: int, what: str) -> str:
    tail = "\n".join(f"    {line}" for line in w.tail) or "    (no output)"
    return (f"shard {w.k} of {n} ({device_label(w.gpus)}, pid {w.proc.pid}) failed: {what}; "
            f"its log is {w.log}; last lines:\n{tail}")


def _stop(workers: list[_Worker], grace_s: float = 5.0) -> None:
    """SIGTERM every worker's process group still alive, SIGKILL what remains after ``grace_s``."""
    alive = [w for w in workers if w.proc.poll() is None]
    for w in alive:
        _signal_group(w.proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for w in alive:
        try:
            w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(w.proc, signal.SIGKILL)
            w.proc.wait()
    for w in workers:
        if w.reader is not None:
            w.reader.join(timeout=5)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _read_shard(w: _Worker, n: int) -> dict:
    try:
        return json.loads(w.out.read_text())
    except (OSError, ValueError) as err:
        why = f"exited 0 but its result {w.out} is unreadable ({err})"
        raise WorkerFailed(_failure(w, n, why)) from None


def merge(cfgs, models: list[tuple[str, Path]], problems: list[list],
          shards: list[dict]) -> list[dict]:
    """One result per model × task (the single-process order): the shards' samples of each pass
    concatenated in shard order (= problem order), metrics recomputed from all of them."""
    results = []
    for m, (name, path) in enumerate(models):
        for t, (cfg, task_problems) in enumerate(zip(cfgs, problems, strict=True)):
            parts = [s["results"][m * len(cfgs) + t] for s in shards]
            for part in parts:
                if part["model"] != name or part["task"] != cfg.task.name:
                    raise WorkerFailed(f"shard result for {part['model']} on {part['task']} where "
                                       f"{name} on {cfg.task.name} was expected")
            samples = [s for p in PASSES for part in parts for s in part["samples"]
                       if s["pass"] == p]
            ids = [p.id for p in task_problems]
            for p in PASSES:
                got = list(dict.fromkeys(s["prompt_id"] for s in samples if s["pass"] == p))
                if got and got != ids:
                    raise WorkerFailed(f"{name} on {cfg.task.name}: the merged {p} pass covers "
                                       f"{len(got)} problems, not the {len(ids)} asked, in order")
            results.append({"model": name, "task": cfg.task.name,
                             "metrics": summarize(samples, cfg.n_samples), "samples": samples,
                             "wall_s": max(part["wall_s"] for part in parts),
                            "model_path": str(path)})
    return results


def worker_main(spec_path: str) -> None:
    """One shard: every model on this worker's problems of every task → the spec's ``out``."""
    from areal_cli import faults
    from areal_cli.eval.config import compose_eval
    from areal_cli.eval.runner import eval_problems
    from areal_cli.eval.sweep import EvalError, evaluate_model
    from areal_cli.runtime import die_with_parent

    die_with_parent()
    # the parent dumps a stuck worker's stacks
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    spec = json.loads(Path(spec_path).read_text())
    out, k, n = Path(spec["out"]), spec["shard"], spec["shards"]
    faults.point("eval", k, out.parent)
    cfgs = compose_eval(spec["overrides"])
    mine = []
    # the parent's choice (overlap with a run dropped)
    for cfg, ids in zip(cfgs, spec["ids"], strict=True):
        split = {p.id: p for p in eval_problems(cfg.task)}
        if any(i not in split for i in ids):
            raise EvalError(f"task {cfg.task.name}: shard {k} loaded other problems than the "
                            "parent (is the task's data changing?)")
        mine.append([split[i] for i in ids])
    print(f"shard {k} of {n}: " + ", ".join(f"{cfg.task.name} {len(p)} problems" for cfg, p in
                                              zip(cfgs, mine, strict=True)), file=sys.stderr,
          flush=True)
    t0, results = time.perf_counter(), []
    for name, path in spec["models"]:
        results += evaluate_model(name, Path(path), cfgs, mine, spec["threads"])
    atomic_write(out,
                 json.dumps({"shard": k, "shards": n, "wall_s": round(time.perf_counter() - t0, 2),
                                  "results": results}))


def _main() -> None:
    from areal_cli.eval.runner import EvalStalled
    from areal_cli.eval.sweep import EvalError

    try:
        worker_main(sys.argv[1])
    except EvalError as err:
        print(f"areal eval worker: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except EvalStalled as err:
        print(f"areal eval worker: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    from areal_cli.runtime import run_main

    run_main(_main)

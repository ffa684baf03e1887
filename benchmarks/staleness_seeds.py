"""Held-out accuracy against maximum staleness, over several seeds, on a many-core CPU host.

One `areal train` per (η, seed), each pinned to its own ``--cores`` cores (taskset), as many at
once as the host's cores allow, then `areal eval` of its final checkpoint on ``--eval-size``
held-out problems (content-disjoint from training) on the same cores. With ``--gpu N`` every run
and evaluation also uses GPU N (trainer and engine colocated), for many seeds in less time. η = 0
is the synchronous run. Prints one line per finished run and a table per η: held-out greedy
accuracy (mean, sd, range), mean reward of the first and last quarter of steps, wall time, mean
staleness.
``<out>/summary.json`` is rewritten after every run, so a cut-off study keeps what finished.

    python benchmarks/staleness_seeds.py --etas 0,1,2,4 --seeds 0-5 --out /tmp/study [override ...]

Overrides (``trainer.steps=40``, ``model=<path>``) go to every run. Wall times of runs that
share a host are comparable only within one study.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path


def parse_list(text: str) -> list[int]:
    """"0,1,4" or "0-5" (inclusive) or a mix: "0-2,7"."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return out


def core_slots(cores_per_run: int) -> list[list[int]]:
    cores = sorted(os.sched_getaffinity(0))
    return [cores[i:i + cores_per_run]
            for i in range(0, len(cores) - cores_per_run + 1, cores_per_run)]


def run_one(eta: int, seed: int, cores: list[int], out: Path, overrides: list[str], eval_size: int,
            gpu: int | None = None) -> dict:
    run_dir = out / f"eta{eta}_seed{seed}"
    pin = ["taskset", "-c", ",".join(map(str, cores))]
    cli = [sys.executable, "-m", "areal_cli.cli"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if gpu is None:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU run, even on a GPU host
    else:  # trainer and engine colocated on one GPU, shared with the other runs of the study
        overrides = [*overrides, f"cluster.gpus=[{gpu}]"]
    t0 = time.time()
    with open(out / f"eta{eta}_seed{seed}.train.log", "w") as log:
        rc = subprocess.run(pin + cli + ["train", "--quiet", f"run_dir={run_dir}", f"seed={seed}",
                                         f"rollout.max_staleness={eta}", "eval.at_end=false",
                                         *overrides],
                            stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    result = {"eta": eta, "seed": seed, "cores": cores, "train_rc": rc,
              "wall_s": round(time.time() - t0, 1)}
    result.update(reward_summary(run_dir))
    if rc != 0:
        return result
    eval_dir = run_dir / "heldout"
    with open(out / f"eta{eta}_seed{seed}.eval.log", "w") as log:
        rc = subprocess.run(pin + cli
                            + ["eval", f"model={run_dir}", f"size={eval_size}",
                               f"task.eval_size={eval_size}",
                                         f"threads={len(cores)}", f"out_dir={eval_dir}",
                                         *([] if gpu is None else [f"gpus=[{gpu}]"]),
                                         *[o for o in overrides
                                           if o.startswith(("task", "reward"))]],
                            stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    result["eval_rc"] = rc
    result["heldout"] = heldout_accuracy(eval_dir)
    return result


def reward_summary(run_dir: Path) -> dict:
    from areal_cli.bench.summary import read_jsonl
    from areal_cli.rundir import RunDir

    steps = read_jsonl(RunDir(run_dir).metrics)  # what a stopped run got through, too
    if not steps:
        return {}
    q = max(1, len(steps) // 4)
    return {"steps": len(steps),
            "reward_first_quarter": mean_of(steps[:q], "reward_mean", 4),
            "reward_last_quarter": mean_of(steps[-q:], "reward_mean", 4),
            "staleness_mean": mean_of(steps, "staleness_mean"),
            "entropy_last_quarter": mean_of(steps[-q:], "entropy"),
            "skipped_rows_last_quarter": mean_of(steps[-q:], "skipped_rows"),
            "train_wall_s": round(steps[-1]["wall_time_s"], 1)}


def mean_of(steps: list[dict], key: str, digits: int = 3) -> float | None:
    """Mean of ``key`` over the steps that have it, rounded; None where none has it."""
    values = [r[key] for r in steps if r.get(key) is not None]
    return round(statistics.fmean(values), digits) if values else None


def heldout_accuracy(eval_dir: Path) -> float | None:
    """Greedy accuracy in percent from ``areal eval``'s eval.json (one model, one task)."""
    path = eval_dir / "eval.json"
    if not path.is_file():
        return None
    accuracy = json.loads(path.read_text())["results"][0]["metrics"].get("accuracy")
    return None if accuracy is None else round(100 * accuracy, 2)


def table(results: list[dict]) -> str:
    lines = [f"{'eta':>4} {'n':>3} {'held-out mean':>13} {'sd':>5} {'range':>13} "
             f"{'reward q1 -> q4':>16} {'wall s':>7} {'stale':>6}"]
    for eta in sorted({r["eta"] for r in results}):
        rs = [r for r in results if r["eta"] == eta and r.get("heldout") is not None]
        if not rs:
            continue
        acc = [r["heldout"] for r in rs]
        sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
        q1 = statistics.fmean(r["reward_first_quarter"] for r in rs)
        q4 = statistics.fmean(r["reward_last_quarter"] for r in rs)
        wall = statistics.fmean(r["train_wall_s"] or 0 for r in rs)
        st = [r["staleness_mean"] for r in rs if r.get("staleness_mean") is not None]
        lines.append(f"{eta:>4} {len(rs):>3} {statistics.fmean(acc):>12.1f}% {sd:>5.1f} "
                     f"{min(acc):>5.1f}-{max(acc):<5.1f}% {q1:>7.3f} -> {q4:<6.3f} {wall:>7.0f} "
                     f"{statistics.fmean(st) if st else 0:>6.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--etas", default="0,4",
                    help="maximum staleness values, e.g. 0,1,2,4 (0 = synchronous)")
    ap.add_argument("--seeds", default="0-3", help="seeds, e.g. 0-5 or 0,3,7")
    ap.add_argument("--cores", type=int, default=2,
                    help="cores per run (default 2, the CPU default's machine)")
    ap.add_argument("--gpu", type=int, default=None,
                    help="run every train and eval on this GPU (colocated; default: the CPU only)")
    ap.add_argument("--eval-size", type=int, default=1000, help="held-out problems per evaluation")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(eta, seed) for seed in parse_list(args.seeds) for eta in parse_list(args.etas)]
    slots = core_slots(args.cores)
    if not slots:
        sys.exit(f"need at least {args.cores} cores; this process may use "
                 f"{len(os.sched_getaffinity(0))}")
    print(f"{len(jobs)} runs on {len(slots)} slots of {args.cores} cores; logs and runs in "
          f"{args.out}", flush=True)
    results: list[dict] = []
    lock = threading.Lock()
    pending = list(jobs)
    t0 = time.time()

    def worker(cores: list[int], delay: float) -> None:
        time.sleep(delay)  # staggered starts: runs pick their free ports one after another
        while True:
            with lock:
                if not pending:
                    return
                eta, seed = pending.pop(0)
            r = run_one(eta, seed, cores, args.out, args.overrides, args.eval_size, args.gpu)
            with lock:
                results.append(r)
                (args.out / "summary.json").write_text(json.dumps({"overrides": args.overrides,
                                                                   "runs": results},
                                                                  indent=1))
                print(f"[{time.time() - t0:6.0f} s] eta={eta} seed={seed}: held-out "
                      f"{r.get('heldout')}%, reward {r.get('reward_first_quarter')} -> "
                      f"{r.get('reward_last_quarter')}, train {r.get('train_wall_s')} s, staleness "
                      f"{r.get('staleness_mean')}, rc "
                      f"{r['train_rc']}/{r.get('eval_rc')}", flush=True)

    threads = [threading.Thread(target=worker, args=(cores, 3.0 * i)) for i,
               cores in enumerate(slots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(table(results), flush=True)


if __name__ == "__main__":
    main()

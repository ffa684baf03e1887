"""``areal train``: preflight checks (``preflight.py``), plan, start, watch, summarize."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from areal_cli.config.schema import RootConfig
from areal_cli.launcher.preflight import UserError, preflight
from areal_cli.rundir import RunDir

RESUMABLE = ("trainer.steps", "resume", "dry_run", "run_dir", "checkpoint.", "launcher.", "eval.",
             "logging.")


def resume_config(resume: str, overrides: list[str]) -> RootConfig:
    """The saved config of ``resume``; overrides that would change what is trained are refused."""
    from pathlib import Path

    from areal_cli.private import check_private_dir
    from areal_cli.runconfig.compose import ConfigError, load_yaml

    problems = check_private_dir(resume) if Path(resume).is_dir() else []
    if problems:
        raise UserError("  - " + "\n  - ".join(problems))
    path = RunDir(resume).config
    if not path.is_file():
        raise UserError(f"  - resume={resume}: no config.yaml there; give the run_dir of an "
                        "earlier run")
    cfg = load_yaml(path)
    refused = []
    from omegaconf import OmegaConf

    node = OmegaConf.structured(cfg)
    for o in overrides:
        key, _, value = o.partition("=")
        key = key.lstrip("+~")
        if key.startswith(RESUMABLE) or key in RESUMABLE:
            if key not in ("resume", "run_dir"):
                OmegaConf.update(node, key, OmegaConf.create({"v": value})["v"] if value else value)
            continue
        refused.append(key)
    lora = [o for o in overrides if o.split("=", 1)[0].lstrip("+~").startswith("trainer.lora.")]
    if lora:
        raise UserError(f"  - {', '.join(lora)}: resume={resume} continues its adapter as it was "
                        f"saved (trainer.lora.rank={cfg.trainer.lora.rank}); drop the override to "
                        "resume, or start a new run from its merged model: "
                        f"model={RunDir(resume).final} {' '.join(lora)}")
    if refused:
        raise UserError("  - a resumed run keeps its config; these overrides would change what is "
                        "trained: " + ", ".join(refused) + f" (allowed: {', '.join(RESUMABLE)})")
    try:
        from areal_cli.runconfig.compose import from_dictconfig

        cfg = from_dictconfig(node)
    except ConfigError as err:
        raise UserError(str(err)) from None
    cfg.resume = str(Path(resume).resolve())
    cfg.run_dir = cfg.resume
    return cfg


def train(cfg: RootConfig, quiet: bool = False, lean: bool = False, checks: bool = True) -> Path:
    """Plan, check and run. ``lean`` (``areal train``): once the run is planned and checked, this
    process replaces itself (exec) with ``launcher/watch.py``, which starts and watches the run
    without the libraries planning needed (torch, transformers, reasoning-gym: ~300 MB that
    would otherwise stay resident for the whole run). ``checks`` false (``--dry-run --no-checks``):
    a dry run prints the plan alone."""
    from areal_cli.launcher.claim import RunLock, claim_run_dir, new_run_dir, taken_problems
    from areal_cli.launcher.plan import make_plan

    if cfg.launcher.name == "slurm":
        from areal_cli.launcher.slurm import submit

        return submit(cfg)
    created = False
    try:
        # the run directory is this user's alone before anything reads or writes it (--dry-run:
        # the same checks, changing nothing)
        if not cfg.dry_run and not cfg.run_dir:
            cfg.run_dir, created = str(new_run_dir()), True
        elif cfg.run_dir:
            created = claim_run_dir(cfg.run_dir, dry_run=cfg.dry_run)
        plan = make_plan(cfg)
        cfg = plan.cfg  # resolved: what config.yaml will hold
        if cfg.dry_run:
            taken = taken_problems(plan.run_dir, cfg.resume) if plan.run_dir.is_dir() else []
            if taken:
                raise ValueError("\n  - ".join(taken))
            print(plan.describe())
            # every check of a real start (the model, the data, custom code, a resume's files),
            # downloading nothing
            if checks:
                preflight(cfg, fetch=False)
                print("# preflight: the model, the data, custom code and the engine check out")
            return plan.run_dir
        shown = ("model", "dtype", "weights", "lengths", "memory", "disk", "reward", "share")
        print("\n".join(f"{k}: {line}" for k in shown
                        for line in plan.notes.get(k, [])[:None if k == "share" else 2]),
              flush=True)
        preflight(cfg)
        lock = RunLock(plan.run_dir)
    except (ValueError, UserError) as err:
        if created:
            RunDir(cfg.run_dir).lock.unlink(missing_ok=True)
            Path(cfg.run_dir).rmdir()  # nothing started: leave no empty run directory behind
        raise err if isinstance(err, UserError) else UserError(f"  - {err}") from None
    try:
        try:
            plan.write()
        except ValueError as err:
            raise UserError(f"  - {err}") from None
        if lean:
            _exec_watcher(plan, quiet, lock)
        return start_and_watch(plan, cfg, quiet, lock)
    finally:
        lock.release()


def _exec_watcher(plan, quiet: bool, lock) -> None:
    import os

    plan_fd = plan.to_fd()  # the commands go to the watcher in memory, never through a file
    os.set_inheritable(lock.fd, True)  # the watcher holds the run's lock from here on
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-m", "areal_cli.launcher.watch", str(plan.run_dir),
            "--lock-fd", str(lock.fd), "--plan-fd", str(plan_fd)]
    os.execv(sys.executable, argv + (["--quiet"] if quiet else []))


def start_and_watch(plan, cfg: RootConfig, quiet: bool, lock) -> Path:
    from areal_cli.launcher.local import LocalLauncher, RunFailed
    from areal_cli.launcher.progress import Progress

    launcher = LocalLauncher(plan, keep_fds=(lock.fd,))
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        launcher.start()
    except RunFailed as err:
        launcher.stop()
        print(f"areal: {err.name} failed to start (exit code {err.code}):\n{err.tail}",
              file=sys.stderr)
        raise SystemExit(1) from None
    print(f"run_dir: {plan.run_dir}  (logs in {RunDir(plan.run_dir).logs})", flush=True)
    progress = None if quiet else Progress(plan.run_dir, cfg.trainer.steps)
    try:
        while True:
            if stop["signal"] is not None:
                print(f"\nstopping ({signal.Signals(stop['signal']).name}) ...", flush=True)
                launcher.stop()
                raise SystemExit(130)
            try:
                if launcher.poll():
                    break
            except RunFailed as err:
                launcher.dump_stacks()
                time.sleep(0.5)
                launcher.stop()
                if progress:
                    progress.close()
                    progress = None
                hint = f"\n{err.name}: {err.hint}" if err.hint else ""
                print(f"\nareal: {err.name} failed (exit code {err.code}); every process was "
                      f"stopped.\nlast lines of its log:\n{err.tail}\n"
                      f"(full logs: {RunDir(plan.run_dir).logs}){hint}",
                      file=sys.stderr, flush=True)
                raise SystemExit(1) from None
            if progress:
                progress.update()
            time.sleep(0.25)
    finally:
        if progress:
            progress.close()
        for s, h in old.items():
            signal.signal(s, h)
    launcher.stop(timeout_s=2)
    summarize(plan.run_dir)
    from areal_cli.launcher.final_eval import evaluate_run

    # on the first generation worker's GPUs, as the run had them (not on whatever GPU 0 is)
    gpus = next((p.env.get("CUDA_VISIBLE_DEVICES") for p in plan.procs if p.name == "rollout-0"),
                None)
    result = evaluate_run(cfg, plan.run_dir, gpus=gpus)
    if result:
        import logging

        from areal_cli.launcher.final_eval import report
        from areal_cli.tracking.fanout import log_final_eval

        log_final_eval(plan.run_dir, cfg, result, report(result),
                       logging.getLogger("areal.tracking"))
    return plan.run_dir


def summarize(run_dir: Path) -> None:
    from areal_cli.durable import TornFile, read_jsonl

    try:
        rows, _ = read_jsonl(RunDir(run_dir).metrics)
    except TornFile as err:
        print(f"areal: {err}", file=sys.stderr)
        return
    if not rows:
        return
    q = max(1, len(rows) // 4)
    first = sum(r.get("reward_mean", 0.0) for r in rows[:q]) / q
    last = sum(r.get("reward_mean", 0.0) for r in rows[-q:]) / q
    print(f"done: {len(rows)} steps in {rows[-1].get('wall_time_s', 0.0):.0f}s; mean reward first "
          f"quarter {first:.3f} → last quarter {last:.3f}; checkpoint {RunDir(run_dir).final}")
    gap = [(r["logp_gap_fresh"], r["fresh_tokens"]) for r in rows if r.get("fresh_tokens")]
    if gap:
        tokens = sum(n for _, n in gap)
        mean = sum(g * n for g, n in gap) / tokens
        far = ("  (far apart: the engine and the trainer compute differently; see docs/gpu.md, "
               "Logprobs)" if mean > 0.1 else "")
        print(f"behaviour vs trainer logprobs, same weights: mean |difference| {mean:.4f} over "
              f"{tokens} tokens{far}")

"""The ``areal`` command line. Thin: every heavy import happens inside a command."""

from __future__ import annotations

import sys

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Fully asynchronous RL for LLM reasoning. Overrides are Hydra `key=value` "
                       "pairs after the command, e.g. `areal train trainer.steps=10 "
                       "rollout.max_staleness=0`.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks.")
app.add_typer(bench_app, name="bench")

OVERRIDES = typer.Argument(None,
                           help="Hydra overrides: key=value (e.g. trainer.steps=10 engine=vllm).")


def _fail(message: str) -> None:
    typer.secho(f"areal: {message}", fg="red", err=True)
    raise typer.Exit(2)


def _compose(overrides: list[str] | None, dry_run: bool = False):
    from areal_cli.runconfig.compose import ConfigError, compose

    try:
        cfg = compose(list(overrides or []))
    except ConfigError as err:
        _fail(f"invalid config:\n{err}")
    cfg.dry_run = cfg.dry_run or dry_run
    return cfg


@app.command(context_settings={"allow_extra_args": True})
def train(overrides: list[str] = OVERRIDES,
          dry_run: bool = typer.Option(
              False, "--dry-run",
              help="Print config, device map and commands, then run the start's checks (model, "
                   "data, custom code); start nothing."),
          no_checks: bool = typer.Option(
              False, "--no-checks",
              help="With --dry-run: the plan alone, without the start's checks (planning for "
                   "another machine, whose data, model or engine need not be here)."),
          quiet: bool = typer.Option(False, "--quiet", help="No progress display.")):
    """Run asynchronous RL: controller + rollout workers + torchrun FSDP2 trainer."""
    cfg = _compose(overrides, dry_run)
    from areal_cli.launcher.plan import hardware_defaults
    from areal_cli.launcher.run import UserError, resume_config
    from areal_cli.launcher.run import train as run_train

    try:
        if cfg.resume:
            cfg = resume_config(cfg.resume, list(overrides or []))
            cfg.dry_run = dry_run
        else:
            extra, lines = hardware_defaults(cfg, list(overrides or []))
            if extra:
                cfg = _compose([*(overrides or []), *extra], dry_run)
            for line in lines:
                typer.echo(line)
        run_train(cfg, quiet=quiet, lean=True, checks=not no_checks)
    except UserError as err:
        _fail(f"cannot start:\n{err}")


@app.command(name="eval", context_settings={"allow_extra_args": True})
def evaluate(overrides: list[str] = OVERRIDES):
    """Evaluate a model on held-out problems (accuracy, pass@k).

    `areal eval model=runs/x task=chain_sum size=64`. GPUs: `areal eval engine=vllm gpus=[0,1]`
    = vLLM, data-parallel (one worker process per GPU, the problems split, one merged eval.json);
    `workers=N` without gpus = N CPU processes. Every key: conf/eval.yaml.
    """
    try:
        from areal_cli.eval.cli import run_eval
    except ImportError:
        typer.secho("areal eval: not yet available", err=True)
        raise typer.Exit(2) from None
    run_eval(list(overrides or []))


@bench_app.command("sync-vs-async", context_settings={"allow_extra_args": True})
def sync_vs_async(overrides: list[str] = OVERRIDES):
    """Run the same workload synchronously (η=0) and asynchronously (η) and compare: throughput,
    when async reaches sync's final reward, held-out accuracy (bench.eta, bench.warmup,
    bench.heldout, bench.heldout_size=1000). A finished mode is kept: bench.modes=sync, then the
    same command with bench.modes=async, runs one mode per call."""
    try:
        from areal_cli.bench.sync_vs_async import run_bench
    except ImportError:
        typer.secho("areal bench sync-vs-async: not yet available", err=True)
        raise typer.Exit(2) from None
    run_bench(list(overrides or []))


@app.command(name="tasks")
def list_tasks(dataset: str = typer.Argument(None,
                                             help="A reasoning-gym dataset: list its params and "
                                                  "defaults.")):
    """List the task presets (conf/task/) and reasoning-gym's datasets, or one dataset's params."""
    from areal_cli.runconfig.compose import conf_dir
    from areal_cli.tasks import catalog

    try:
        typer.echo(catalog.describe(dataset) if dataset else catalog.listing(conf_dir()))
    except ValueError as err:
        _fail(str(err))


@app.command()
def status(run_dir: str = typer.Argument(..., help="A run directory.")):
    """Show a run's processes and its last metrics."""
    from areal_cli.launcher.status import show

    show(run_dir)


@app.command()
def plot(run_dirs: list[str] = typer.Argument(..., help="One or more run directories."),
         out: str = typer.Option(None, "--out", "-o",
                                 help="The PNG to write; default plot.png in the first run.")):
    """Compare runs in one PNG: reward, response length, staleness, step time and throughput
    against step and wall time, one colour per run."""
    from areal_cli.tracking.plot import NotARun, plot_runs

    try:
        typer.echo(plot_runs(run_dirs, out))
    except NotARun as err:
        _fail(str(err))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()

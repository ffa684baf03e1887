"""The process ``areal train`` becomes once the run is planned and checked (``run.train(lean=True)``
exec's into it, same pid, same terminal, holding the run's lock and an in-memory file with the
plan, ``Plan.to_fd``; nothing it starts is read from the run directory): it starts the run's
processes, shows progress, stops them on Ctrl-C or a failure, and ends with the summary and the
closing evaluation. It imports neither torch nor transformers nor reasoning-gym until that
evaluation.

    python -m areal_cli.launcher.watch RUN_DIR --lock-fd FD --plan-fd FD [--quiet]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--lock-fd", type=int, required=True)
    ap.add_argument("--plan-fd", type=int, required=True)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    from areal_cli.launcher.claim import RunLock
    from areal_cli.launcher.plan import Plan
    from areal_cli.launcher.run import start_and_watch

    lock = RunLock.adopt(args.run_dir, args.lock_fd)
    try:
        plan = Plan.from_fd(args.run_dir.resolve(), args.plan_fd)
        start_and_watch(plan, plan.cfg, args.quiet, lock)
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        lock.release()


if __name__ == "__main__":
    main()

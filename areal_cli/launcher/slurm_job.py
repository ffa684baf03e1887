"""Small steps the sbatch script runs inside the job (``python -m areal_cli.launcher.slurm_job``).

- ``ports``: on the first training node, print ``<hostname> <port> <port>`` (two ports free
  there now: torchrun's rendezvous and the weight-broadcast TCPStore).
- ``prepare <run_dir> <train_host> <weights_port> <rdzv_port>``: on node 0, rewrite
  ``endpoints.json`` so every ZeroMQ endpoint is ``tcp://<hostname of node 0>:<free port>``
  and the TCPStore is ``<train_host>:<weights_port>``; after a requeue with a checkpoint,
  set ``resume`` in ``config.yaml`` to the run directory.
- ``rollout <run_dir> <gpus_per_worker>``: one task of the rollout step becomes rollout
  worker ``$SLURM_PROCID`` (exec, same pid), its GPUs narrowed to this task's share when
  Slurm handed the task all GPUs of the step.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from areal_cli.rundir import RunDir


def ports() -> None:
    from areal_cli.transport.channels import free_ports

    print(socket.gethostname(), *free_ports("0.0.0.0", 2), flush=True)


def prepare(run_dir: Path, train_host: str, weights_port: int, rdzv_port: int) -> None:
    from areal_cli.transport.channels import make_endpoints

    host = socket.gethostname()
    taken = {weights_port, rdzv_port} if _same_host(host, train_host) else set()
    for _ in range(20):
        ep = make_endpoints(host)
        if not taken & {int(a.rsplit(":", 1)[1]) for a in (ep.work, ep.results, ep.batches,
                                                           ep.control, ep.status)}:
            break
    ep.weights_host, ep.weights_port = train_host, weights_port
    ep.publish(run_dir)  # this job's one writer of endpoints.json (the controller only reads it)
    print(f"areal: endpoints on {host}, weight TCPStore {train_host}:{weights_port}, "
          f"rendezvous {train_host}:{rdzv_port}", flush=True)
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if restarts and any(RunDir(run_dir).checkpoints.glob("*")):
        _set_resume(run_dir)


def _same_host(a: str, b: str) -> bool:
    try:
        return a == b or socket.gethostbyname(a) == socket.gethostbyname(b)
    except OSError:
        return False


def _set_resume(run_dir: Path) -> None:
    from areal_cli.runconfig.compose import load_yaml, save_yaml

    cfg = load_yaml(RunDir(run_dir).config)
    cfg.resume = str(run_dir)
    save_yaml(cfg, RunDir(run_dir).config)
    print(f"areal: requeued job; resume={run_dir}", flush=True)


def rollout(run_dir: str, gpus_per_worker: int) -> None:
    index = int(os.environ["SLURM_PROCID"])
    visible = [x for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x]
    if gpus_per_worker and len(visible) > gpus_per_worker:
        local = int(os.environ.get("SLURM_LOCALID", "0"))
        mine = visible[local * gpus_per_worker:(local + 1) * gpus_per_worker]
        if len(mine) < gpus_per_worker:
            raise SystemExit(f"rollout task {local}: {len(visible)} visible GPU(s) {visible}, "
                             f"{gpus_per_worker} per worker; check launcher.gpus_per_node")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    os.execv(sys.executable, [sys.executable, "-m", "areal_cli.rollout.main", run_dir, str(index)])


def main(argv: list[str]) -> None:
    if argv[:1] == ["ports"]:
        ports()
    elif argv[:1] == ["prepare"] and len(argv) == 5:
        prepare(Path(argv[1]).resolve(), argv[2], int(argv[3]), int(argv[4]))
    elif argv[:1] == ["rollout"] and len(argv) == 3:
        rollout(argv[1], int(argv[2]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])

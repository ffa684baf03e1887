"""The run plan: run directory, device map and the exact commands — printed by --dry-run."""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path

from areal_cli.config.load import save_yaml, to_yaml
from areal_cli.config.schema import RootConfig
from areal_cli.durable import atomic_write
from areal_cli.launcher.rundir import check_links
from areal_cli.transport.channels import Endpoints, free_ports, make_endpoints


@dataclass
class Proc:
    name: str  # "controller", "rollout-0", "trainer" (torchrun, all ranks)
    argv: list[str]
    env: dict = field(default_factory=dict)  # extra environment (CUDA_VISIBLE_DEVICES, ...)


@dataclass
class Plan:
    cfg: RootConfig
    run_dir: Path
    endpoints: Endpoints
    devices: dict  # role → list of GPU ids ([] = CPU)
    procs: list[Proc]

    def describe(self) -> str:
        lines = ["# resolved config", to_yaml(self.cfg), "# device map"]
        for role, ids in self.devices.items():
            lines.append(f"{role}: {'GPU ' + ','.join(map(str, ids)) if ids else 'CPU'}")
        lines.append("# commands")
        for p in self.procs:
            env = " ".join(f"{k}={v}" for k, v in p.env.items())
            lines.append(f"[{p.name}] {env + ' ' if env else ''}{' '.join(p.argv)}")
        return "\n".join(lines)

    def write(self) -> None:
        if not self.cfg.resume and (self.run_dir / "metrics.jsonl").exists():
            raise ValueError(f"run_dir={self.run_dir} already holds a run; continue it with "
                             f"resume={self.run_dir} or choose another run_dir")
        links = check_links(self.run_dir)
        if links:
            raise ValueError("\n  - ".join(links))
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        save_yaml(self.cfg, self.run_dir / "config.yaml")
        atomic_write(self.run_dir / "endpoints.json", json.dumps(self.endpoints.to_dict(), indent=1))


def visible_gpus() -> list[int]:
    try:
        import torch
    except ImportError:
        return []
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def device_map(cfg: RootConfig, gpus: list[int] | None = None) -> dict:
    """Which GPUs generate and which train; one GPU is shared (colocated); none = CPU."""
    avail = visible_gpus() if gpus is None else gpus
    pool = [int(g) for g in cfg.cluster.gpus] or avail
    missing = [g for g in pool + list(cfg.rollout.gpus) + list(cfg.trainer.gpus) if g not in avail]
    if missing:
        raise ValueError(f"GPU id(s) {missing} do not exist here (visible: {avail or 'none'}); "
                         "fix cluster.gpus / rollout.gpus / trainer.gpus")
    if not pool:
        return {"rollout": [], "trainer": []}
    if cfg.rollout.gpus or cfg.trainer.gpus:
        return {"rollout": [int(g) for g in cfg.rollout.gpus] or pool[:1],
                "trainer": [int(g) for g in cfg.trainer.gpus] or pool[len(cfg.rollout.gpus):]}
    if len(pool) == 1:
        return {"rollout": pool, "trainer": pool}  # colocated
    n_gen = cfg.rollout.workers if cfg.rollout.workers < len(pool) else len(pool) // 2
    return {"rollout": pool[:n_gen], "trainer": pool[n_gen:]}


def resolve_colocation(cfg: RootConfig, devices: dict) -> None:
    """A rollout worker on trainer rank 0's GPU cannot join an NCCL group with it: the update then
    goes through host memory (gloo), which only the embedded engine can receive."""
    if not devices["trainer"] or not devices["rollout"]:
        return
    worker_gpus = {devices["rollout"][i % len(devices["rollout"])] for i in range(cfg.rollout.workers)}
    if devices["trainer"][0] not in worker_gpus:
        return
    if cfg.engine.name == "vllm":
        raise ValueError(f"engine=vllm cannot share GPU {devices['trainer'][0]} with trainer rank 0: vLLM "
                         "receives weights over NCCL only. Use engine=hf on one GPU, or give the trainer a GPU "
                         "of its own (e.g. cluster.gpus=[0,1])")
    if cfg.weights.backend == "nccl":
        raise ValueError("weights.backend=nccl: a rollout worker shares trainer rank 0's GPU and NCCL refuses "
                         "two ranks on one GPU; use weights.backend=auto (or gloo)")
    cfg.weights.backend = "gloo"


def make_plan(cfg: RootConfig, gpus: list[int] | None = None) -> Plan:
    # `areal train` creates a fresh directory before planning (rundir.new_run_dir); this name is
    # what --dry-run shows
    run_dir = Path(cfg.run_dir or f"runs/{_dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}").resolve()
    cfg.run_dir = str(run_dir)
    try:
        ep = make_endpoints(cfg.launcher.host, cfg.launcher.port_base)
    except OSError as err:
        raise ValueError(str(err)) from None
    devices = device_map(cfg, gpus)
    resolve_colocation(cfg, devices)
    if cfg.engine.name == "vllm" and cfg.engine.weight_update == "auto":
        from areal_cli.models import resolve_model
        from areal_cli.transport.vllm_weights import resolve_weight_update

        cfg.engine.weight_update = resolve_weight_update("auto", resolve_model(cfg.model),
                                                         cfg.engine.tensor_parallel_size)
    py = sys.executable
    procs = [Proc("controller", [py, "-m", "areal_cli.controller.main", str(run_dir)])]
    for i in range(cfg.rollout.workers):
        env = {}
        if devices["rollout"]:
            gpu = devices["rollout"][i % len(devices["rollout"])]
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        procs.append(Proc(f"rollout-{i}", [py, "-m", "areal_cli.rollout.main", str(run_dir), str(i)], env))
    master_port = cfg.launcher.port_base + 6 if cfg.launcher.port_base else free_ports(cfg.launcher.host, 1)[0]
    tenv = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices["trainer"]))} if devices["trainer"] else {}
    procs.append(Proc("trainer", [
        py, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(cfg.trainer.ranks),
        "--master-addr", cfg.launcher.host, "--master-port", str(master_port),
        "-m", "areal_cli.trainer.main", str(run_dir)], tenv))
    if devices["trainer"] and cfg.trainer.ranks > len(devices["trainer"]):
        raise ValueError(f"trainer.ranks={cfg.trainer.ranks} but only {len(devices['trainer'])} GPU(s) "
                         "train; lower trainer.ranks or give trainer.gpus more ids")
    return Plan(cfg, run_dir, ep, devices, procs)


def child_env(extra: dict) -> dict:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in extra.items()})
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return env

"""Which GPUs a run has and which process computes on which: the GPUs visible here and their
memory, the device map (generation first, then the trainer ranks; one GPU shared), each rollout
worker's GPUs, and whether a worker shares trainer rank 0's GPU."""

from __future__ import annotations

import os
import shutil

from areal_cli.config.schema import RootConfig
from areal_cli.engines import spanning, spec


def visible_gpus() -> list[int]:
    if not (os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi")):
        return []  # no NVIDIA driver: no GPU, and no need to import torch to learn it
    try:
        import torch
    except ImportError:
        return []
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def gpu_memory(gpus: list[int]) -> int:
    """Bytes of memory of the first of ``gpus`` (torch's device ids here); 0 where none is visible
    here."""
    if not gpus or not visible_gpus():
        return 0
    import torch

    try:
        return int(torch.cuda.get_device_properties(int(gpus[0])).total_memory)
    except (RuntimeError, AssertionError, ValueError):  # an id this process does not see
        return 0


def device_map(cfg: RootConfig, gpus: list[int] | None = None) -> dict:
    """Which GPUs generate and which train: generation takes the first rollout.workers ×
    engine.vllm.tensor_parallel_size GPUs of the pool, the trainer the next trainer.ranks; one GPU
    is shared (colocated); none = CPU. Raises ValueError when the counts do not add up."""
    avail = visible_gpus() if gpus is None else gpus
    pool = [int(g) for g in cfg.cluster.gpus] or avail
    missing = [g for g in pool + list(cfg.rollout.gpus) + list(cfg.trainer.gpus) if g not in avail]
    if missing:
        raise ValueError(f"GPU id(s) {missing} do not exist here (visible: {avail or 'none'}); "
                         "fix cluster.gpus / rollout.gpus / trainer.gpus")
    w, tp, ranks = cfg.rollout.workers, cfg.engine.vllm.tensor_parallel_size, cfg.trainer.ranks
    if not pool:  # the CPU (or Slurm, whose job script places the processes)
        return {"rollout": [], "trainer": []}
    if tp < 1 or tp > 1 and not spec(cfg.engine.name).tensor_parallel:
        raise ValueError(f"engine.vllm.tensor_parallel_size={tp}: must be >= 1, and > 1 only with "
                         + " or ".join(f"engine={n}" for n in spanning()))
    if cfg.rollout.gpus or cfg.trainer.gpus:
        rollout = [int(g) for g in cfg.rollout.gpus] or pool[:w * tp if tp > 1 else 1]
        trainer = [int(g) for g in cfg.trainer.gpus] or pool[len(cfg.rollout.gpus):]
    elif len(pool) == 1:
        if tp > 1:
            raise ValueError(f"engine.vllm.tensor_parallel_size={tp} needs {tp} GPUs per rollout "
                             f"worker and cluster.gpus has one; lower it to 1 or give more GPUs")
        rollout, trainer = pool, pool  # colocated
    else:
        n_gen = w * tp if tp > 1 else (w if w < len(pool) else len(pool) // 2)
        if n_gen >= len(pool):
            raise ValueError(f"rollout.workers={w} × engine.vllm.tensor_parallel_size={tp} = "
                             f"{n_gen} generation GPUs leave none of the {len(pool)} GPUs {pool} "
                             "to train: lower rollout.workers or engine.vllm.tensor_parallel_size, "
                             "or add GPUs to cluster.gpus")
        rollout, trainer = pool[:n_gen], pool[n_gen:]
    if tp > 1 and len(rollout) < w * tp:
        raise ValueError(f"rollout.workers={w} × engine.vllm.tensor_parallel_size={tp} needs "
                         f"{w * tp} generation GPUs; rollout.gpus has {len(rollout)} ({rollout}): "
                         f"give it {w * tp} ids or lower rollout.workers")
    if ranks > len(trainer):
        raise ValueError(f"trainer.ranks={ranks} but only {len(trainer)} GPU(s) {trainer} are left "
                         f"to train (the first {len(rollout)} of {pool} generate): lower "
                         "trainer.ranks, lower rollout.workers / "
                         "engine.vllm.tensor_parallel_size, or add GPUs to cluster.gpus")
    used = {g for gs in worker_gpus(cfg, rollout) for g in gs} | set(trainer[:ranks])
    out = {"rollout": rollout[:w * tp] if tp > 1 else rollout, "trainer": trainer[:ranks]}
    idle = [g for g in dict.fromkeys(pool + rollout + trainer) if g not in used]
    return {**out, "idle": idle} if idle else out


def worker_gpus(cfg: RootConfig, rollout: list[int]) -> list[list[int]]:
    """Each rollout worker's GPUs: tensor_parallel_size consecutive ids of ``rollout``, or, at TP 1,
    one id each, round-robin (several workers may share a GPU); [] on the CPU."""
    w, tp = cfg.rollout.workers, cfg.engine.vllm.tensor_parallel_size
    if not rollout:
        return [[] for _ in range(w)]
    if tp > 1:
        return [rollout[i * tp:(i + 1) * tp] for i in range(w)]
    return [[rollout[i % len(rollout)]] for i in range(w)]


def shares_rank0_gpu(cfg: RootConfig, devices: dict) -> bool:
    """Whether a rollout worker runs on trainer rank 0's GPU. It cannot join an NCCL group with
    rank 0: the update then goes device to device through CUDA IPC (weights.backend=ipc), which
    joins only processes of one GPU; ValueError naming the fix where the config asks for a backend
    that cannot serve the layout."""
    backend = str(cfg.weights.backend)
    workers = worker_gpus(cfg, devices["rollout"])
    if not devices["trainer"] or not devices["rollout"]:
        if backend == "ipc":
            raise ValueError("weights.backend=ipc joins processes of one GPU: the trainer and the "
                             "rollout workers must share it (cluster.gpus=[0]); use "
                             "weights.backend=auto")
        return False
    rank0 = devices["trainer"][0]
    if not any(rank0 in gs for gs in workers):
        if backend == "ipc":
            raise ValueError(f"weights.backend=ipc joins processes of one GPU, and no rollout "
                             f"worker is on trainer rank 0's GPU {rank0}: use weights.backend=auto "
                             "(NCCL between GPUs)")
        return False
    if backend == "nccl":
        raise ValueError("weights.backend=nccl: a rollout worker shares trainer rank 0's GPU and "
                         "NCCL refuses two ranks on one GPU; use weights.backend=auto (CUDA IPC "
                         "there)")
    others = [i for i, gs in enumerate(workers) if rank0 not in gs]
    if backend in ("auto", "ipc") and others:
        raise ValueError(f"rollout worker(s) {others} are on other GPUs than trainer rank 0's GPU "
                         f"{rank0}, which rollout-0 shares: one weight group cannot be CUDA IPC "
                         "for one and NCCL for another. Give every rollout worker GPU(s) of its "
                         "own (rollout.gpus / trainer.gpus), or use weights.backend=gloo")
    return True


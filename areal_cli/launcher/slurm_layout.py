"""Which nodes of a Slurm job generate and which train, and how many processes each runs.

The job's nodes, in ``scontrol show hostnames`` order: the first ``gen_nodes`` run rollout
workers, the rest run the torchrun trainer; the controller runs on node 0 (beside the
first rollout workers). One node: both roles share it, its GPUs split like the local launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_cli.config.schema import RootConfig


@dataclass
class SlurmLayout:
    nodes: int  # nodes of the job
    gen_nodes: tuple[int, int]  # [first, end) node indices that run rollout workers
    train_nodes: tuple[int, int]  # [first, end) node indices that run trainer ranks
    workers: int  # rollout workers over all generation nodes
    workers_per_node: int  # rollout tasks on one generation node
    gpus_per_worker: int  # GPUs of one rollout worker (0 = CPU)
    trainer_nproc: int  # torchrun --nproc-per-node on every training node
    trainer_gpus: int  # GPUs of the trainer on one training node (0 = CPU)

    @property
    def trainer_world(self) -> int:
        return (self.train_nodes[1] - self.train_nodes[0]) * self.trainer_nproc

    @property
    def shared(self) -> bool:
        """One node runs both roles."""
        return self.gen_nodes[0] == self.train_nodes[0]


def slurm_layout(cfg: RootConfig) -> SlurmLayout:
    """The layout of ``cfg.launcher``; raises ValueError naming the fix."""
    lc = cfg.launcher
    if lc.nodes < 1:
        raise ValueError(f"launcher.nodes={lc.nodes}: must be >= 1")
    if lc.gpus_per_node < 0:
        raise ValueError(f"launcher.gpus_per_node={lc.gpus_per_node}: must be >= 0 (0 = CPU nodes)")
    return _one_node(cfg) if lc.nodes == 1 else _many_nodes(cfg)


def _one_node(cfg: RootConfig) -> SlurmLayout:
    g, tp = cfg.launcher.gpus_per_node, max(1, cfg.engine.vllm.tensor_parallel_size)
    if g == 0:
        return SlurmLayout(1, (0, 1), (0, 1), cfg.rollout.workers, cfg.rollout.workers, 0,
                           cfg.trainer.ranks, 0)
    if g < 2:
        raise ValueError("launcher.gpus_per_node=1: one GPU cannot be split between the rollout "
                         "and trainer steps; use launcher=local on that node (it colocates), or "
                         "launcher.nodes=2")
    gen_gpus = cfg.rollout.workers * tp if cfg.rollout.workers * tp < g else g // 2
    workers = gen_gpus // tp
    if workers < 1:
        raise ValueError(f"engine.vllm.tensor_parallel_size={tp} leaves no GPU for training on a "
                         f"{g}-GPU node; lower it or use launcher.nodes=2")
    return SlurmLayout(1, (0, 1), (0, 1), workers, workers, tp, g - workers * tp, g - workers * tp)


def _many_nodes(cfg: RootConfig) -> SlurmLayout:
    lc, tp = cfg.launcher, max(1, cfg.engine.vllm.tensor_parallel_size)
    n_gen = lc.gen_nodes or lc.nodes // 2
    if not 1 <= n_gen < lc.nodes:
        raise ValueError(f"launcher.gen_nodes={lc.gen_nodes} with launcher.nodes={lc.nodes}: "
                         f"choose 1..{lc.nodes - 1} generation nodes (0 = half)")
    n_train = lc.nodes - n_gen
    gen, train = (0, n_gen), (n_gen, lc.nodes)
    if lc.gpus_per_node == 0:
        w, r = cfg.rollout.workers, cfg.trainer.ranks
        if w % n_gen or r % n_train:
            raise ValueError(f"CPU nodes: rollout.workers={w} over {n_gen} generation node(s) and "
                             f"trainer.ranks={r} over {n_train} training node(s) must divide "
                             "evenly")
        return SlurmLayout(lc.nodes, gen, train, w, w // n_gen, 0, r // n_train, 0)
    if lc.gpus_per_node % tp:
        raise ValueError(f"engine.vllm.tensor_parallel_size={tp} does not divide "
                         f"launcher.gpus_per_node={lc.gpus_per_node}: a rollout worker's GPUs "
                         "stay on one node")
    per_node = lc.gpus_per_node // tp
    return SlurmLayout(lc.nodes, gen, train, per_node * n_gen, per_node, tp,
                       lc.gpus_per_node, lc.gpus_per_node)


def apply_layout(cfg: RootConfig, lay: SlurmLayout) -> list[str]:
    """Set rollout.workers and trainer.ranks (= trainer world size) from the layout.

    Returns a note for each value that changed, so ``submit`` can say so.
    """
    notes = []
    if cfg.rollout.workers != lay.workers:
        notes.append(f"rollout.workers={lay.workers} (one per {lay.gpus_per_worker or 'CPU'} "
                     f"GPU(s) of the generation nodes; was {cfg.rollout.workers})")
        cfg.rollout.workers = lay.workers
    if cfg.trainer.ranks != lay.trainer_world:
        notes.append(f"trainer.ranks={lay.trainer_world} (the trainer's world size; was "
                     f"{cfg.trainer.ranks})")
        cfg.trainer.ranks = lay.trainer_world
    samples = cfg.trainer.batch_size * cfg.rollout.group_size
    if samples % cfg.trainer.ranks:
        raise ValueError(f"trainer.batch_size × rollout.group_size = {samples} samples do not "
                         f"split over {cfg.trainer.ranks} trainer ranks; choose a batch_size that "
                         "divides evenly")
    return notes

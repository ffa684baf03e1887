"""Every path of a run directory, in one place: ``RunDir(run_dir).metrics`` and so on.

Every process of a run (launcher, controller, rollout workers, trainer ranks, evaluation, tools
that read a finished run) names run-directory files only through this class, so the layout below
is the whole on-disk contract:

| path | written by | content |
|---|---|---|
| ``config.yaml`` | launcher | the resolved config |
| ``run.lock`` | launcher | ``flock`` held for the whole run; the holder's pid |
| ``keys/`` | launcher | this run's CURVE keys (directory 0700, files 0600) |
| ``stores/`` | launcher | file stores (0700): the trainer ranks' rendezvous, the weight group's
(controller names it) |
| ``endpoints.json`` | controller (local) or the Slurm job's prepare step | every socket address of
the run |
| ``controller.ready`` | controller | its sockets are bound and ``endpoints.json`` is final |
| ``reward_endpoint.json`` | reward-model process | the address of its socket (reward.fn=model /
judge) |
| ``logs/<process>.log`` | launcher (``trainer-<rank>.log``: each rank) | one per process |
| ``pids.json`` | local launcher | the pid of every process it started (``areal status``) |
| ``job.sbatch``, ``slurm_job_id`` | Slurm launcher | the submitted script and its job id |
| ``splits.json`` | controller | the train/eval split and the overlap between them (0) |
| ``metrics.jsonl`` | controller | one object per step |
| ``trajectories.jsonl`` | controller | one object per trained sample |
| ``weight_updates.jsonl`` | controller | per rollout worker and update: pause and load times |
| ``tracking.json`` | controller | the experiment trackers' run ids (resume continues them) |
| ``tensorboard/``, ``wandb/``, ``mlruns/`` | controller | the experiment trackers' local files
(``logging.backends``) |
| ``plot.png`` | ``areal plot`` | the default output of ``areal plot <run_dir> ...`` |
| ``checkpoints/step_<v>.partial/`` | trainer ranks, then controller | a checkpoint being written |
| ``checkpoints/step_<v>/`` | controller (rename) | a complete checkpoint of version v, with the
run's marker ``checkpoint.json`` |
| ``checkpoints/final/`` | trainer rank 0 | Hugging Face checkpoint of the trained model |
| ``checkpoints/eval/`` | trainer rank 0 | the weights ``eval.every`` evaluates |
| ``eval_final.json`` | launcher | the closing evaluation (``eval.at_end``) |
| ``FAULT_REACHED`` | any (tests only) | the fault point a process reached (``faults.py``) |
"""

from __future__ import annotations

from pathlib import Path


class RunDir:
    """The paths of the run directory ``root`` (nothing is created or read here)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    config = property(lambda self: self.root / "config.yaml", doc="the resolved config")
    lock = property(lambda self: self.root / "run.lock",
                    doc="flock of the live run; the holder's pid")
    keys = property(lambda self: self.root / "keys", doc="CURVE keys (0700)")
    stores = property(lambda self: self.root / "stores",
                      doc="file stores of the run's process groups (0700)")
    endpoints = property(lambda self: self.root / "endpoints.json",
                         doc="socket addresses (transport.channels)")
    reward_endpoint = property(lambda self: self.root / "reward_endpoint.json",
                               doc="the reward-model process's address")
    controller_ready = property(lambda self: self.root / "controller.ready",
                                doc="the controller is bound")
    logs = property(lambda self: self.root / "logs", doc="one log per process")
    pids = property(lambda self: self.root / "pids.json",
                    doc="pids of the local launcher's processes")
    sbatch = property(lambda self: self.root / "job.sbatch", doc="the submitted Slurm script")
    slurm_job_id = property(lambda self: self.root / "slurm_job_id", doc="the Slurm job id")
    tensorboard = property(lambda self: self.root / "tensorboard", doc="TensorBoard event files")
    wandb = property(lambda self: self.root / "wandb", doc="W&B's local files (offline mode)")
    mlruns = property(lambda self: self.root / "mlruns", doc="MLflow's local store")
    plot = property(lambda self: self.root / "plot.png", doc="areal plot's default output")
    splits = property(lambda self: self.root / "splits.json", doc="the train/eval split report")
    metrics = property(lambda self: self.root / "metrics.jsonl", doc="one row per step")
    trajectories = property(lambda self: self.root / "trajectories.jsonl",
                            doc="one row per trained sample")
    weight_updates = property(lambda self: self.root / "weight_updates.jsonl",
                              doc="one row per worker update")
    tracking = property(lambda self: self.root / "tracking.json",
                        doc="experiment trackers' run ids")
    checkpoints = property(lambda self: self.root / "checkpoints", doc="step_<v>, final, eval")
    final = property(lambda self: self.root / "checkpoints" / "final",
                     doc="HF checkpoint of the trained model")
    eval_checkpoint = property(lambda self: self.root / "checkpoints" / "eval",
                               doc="weights eval.every reads")
    eval_final = property(lambda self: self.root / "eval_final.json", doc="the closing evaluation")
    fault_reached = property(lambda self: self.root / "FAULT_REACHED",
                             doc="fault injection (tests)")

    def log(self, process: str) -> Path:
        """``logs/<process>.log``."""
        return self.logs / f"{process}.log"

    def store(self, name: str) -> Path:
        """``stores/<name>``: a torch FileStore, readable and writable by the run's user alone."""
        return self.stores / name

    def checkpoint(self, version: int) -> Path:
        """``checkpoints/step_<version>``: complete once it exists under this name."""
        return self.checkpoints / f"step_{version}"

    def partial_checkpoint(self, version: int) -> Path:
        """``checkpoints/step_<version>.partial``: being written, never picked by resume."""
        return self.checkpoints / f"step_{version}.partial"

    @property
    def records(self) -> tuple[Path, Path, Path]:
        """The JSONL records a checkpoint must not point past: metrics, trajectories, weight
        updates."""
        return self.metrics, self.trajectories, self.weight_updates

    @property
    def no_links(self) -> tuple[Path, ...]:
        """Paths a run writes through or deletes under: never symbolic links."""
        return (self.checkpoints, *self.records, self.logs, self.config, self.endpoints,
                self.stores)

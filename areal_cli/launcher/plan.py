"""The run plan: run directory, device map, the resolved config and the exact commands — printed
by --dry-run. Planning is where every ``auto`` of the config is resolved (``config/resolve.py``):
the plan's ``cfg`` is what config.yaml holds and what every process reads."""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import json
import os
import secrets
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from areal_cli.config import cpu_dtype
from areal_cli.config.resolve import ALLOCATORS, Placement, checkpointing, find_allocator
from areal_cli.config.schema import RootConfig
from areal_cli.engines import spec
from areal_cli.launcher.claim import claim_run_dir, taken_problems
from areal_cli.launcher.devices import (
    device_map,
    gpu_memory,
    shares_rank0_gpu,
    visible_gpus,
    worker_gpus,
)
from areal_cli.launcher.reward_plan import reward_notes, reward_proc
from areal_cli.launcher.share import choose_share, share_notes
from areal_cli.private import make_private_dir
from areal_cli.runconfig.autos import resolve
from areal_cli.runconfig.bounds import kv_memory_problems
from areal_cli.runconfig.compose import save_yaml, to_yaml
from areal_cli.rundir import RunDir
from areal_cli.runtime import physical_gpus
from areal_cli.transport.auth import make_keys
from areal_cli.transport.channels import check_ports, free_ports, is_loopback


@dataclass
class Proc:
    # "controller", "rollout-0", "trainer" (torchrun and all ranks; one CPU rank without torchrun)
    name: str
    argv: list[str]
    env: dict = field(default_factory=dict)  # extra environment (CUDA_VISIBLE_DEVICES, ...)


@dataclass
class Plan:
    cfg: RootConfig
    run_dir: Path
    devices: dict  # role → list of GPU ids ([] = CPU); "idle": GPUs of the pool no process uses
    procs: list[Proc]
    # "model", "weights": lines printed at start and by --dry-run
    notes: dict = field(default_factory=dict)

    def describe(self) -> str:
        lines = ["# resolved config", to_yaml(self.cfg), "# model", *self.notes.get("model", []),
                 "# device map"]
        for role, ids in self.devices.items():
            lines.append(f"{role}: {'GPU ' + ','.join(map(str, ids)) if ids else 'CPU'}"
                         + ("  (raise trainer.ranks or rollout.workers to use them)"
                            if role == "idle" else ""))
        lines += ["# dtypes", *self.notes.get("dtype", [])]
        lines += ["# weight updates", *self.notes.get("weights", [])]
        if self.notes.get("reward"):
            lines += ["# rewards", *self.notes["reward"]]
        if self.notes.get("lengths"):
            lines += ["# response lengths", *self.notes["lengths"]]
        lines += ["# memory", *self.notes.get("memory", []), *self.notes.get("disk", [])]
        if self.notes.get("share"):
            lines += ["# one GPU shared", *self.notes["share"]]
        lines.append("# commands")
        for p in self.procs:
            env = " ".join(f"{k}={v}" for k, v in p.env.items())
            lines.append(f"[{p.name}] {env + ' ' if env else ''}{' '.join(p.argv)}")
        return "\n".join(lines)

    def to_fd(self) -> int:
        """The plan (resolved config, commands, device map) in an anonymous in-memory file that the
        watcher inherits across exec (``launcher/watch.py``): the commands to start never pass
        through a file another process could swap, and nothing is read back from the run directory
        to be executed."""
        data = json.dumps({"config": to_yaml(self.cfg), "devices": self.devices,
                           "procs": [{"name": p.name, "argv": p.argv, "env": p.env}
                                     for p in self.procs]}).encode()
        fd = os.memfd_create("areal-plan", 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.set_inheritable(fd, True)
        return fd

    @classmethod
    def from_fd(cls, run_dir: Path, fd: int) -> Plan:
        """The plan ``to_fd`` wrote into ``fd`` (closed here); its config was validated when
        planned."""
        from omegaconf import OmegaConf

        from areal_cli.runconfig.compose import from_dictconfig

        with os.fdopen(fd, "rb") as f:
            f.seek(0)
            saved = json.loads(f.read())
        procs = [Proc(p["name"], p["argv"], p["env"]) for p in saved["procs"]]
        cfg = from_dictconfig(OmegaConf.create(saved["config"]), check=False)
        return cls(cfg, run_dir, saved["devices"], procs)

    def write(self) -> None:
        """The run directory's config, keys and logs/ (the controller publishes endpoints.json)."""
        rd = RunDir(self.run_dir)
        # created 0700, or the running user's alone (Slurm comes here first)
        claim_run_dir(self.run_dir)
        taken = taken_problems(self.run_dir, self.cfg.resume)
        if taken:
            raise ValueError("\n  - ".join(taken))
        rd.logs.mkdir(parents=True, exist_ok=True)
        # an earlier start's stores: never joined by this one
        shutil.rmtree(rd.stores, ignore_errors=True)
        make_private_dir(rd.stores)
        make_keys(self.run_dir)  # this run's CURVE keys: only its processes can use its sockets
        save_yaml(self.cfg, rd.config)
        rd.endpoints.unlink(missing_ok=True)  # an earlier start's addresses: never read by this one
        rd.reward_endpoint.unlink(missing_ok=True)


GPU_DEFAULTS = {"trainer.batch_size": 16, "trainer.steps": 50}
"""conf/'s defaults fit a 2-core CPU (4 groups a step, 30 steps); a run on GPUs takes these where
its overrides name none (BENCHMARKS.md "One GPU")."""


def hardware_defaults(cfg: RootConfig, overrides: list[str]) -> tuple[list[str], list[str]]:
    """What a local run on GPUs gets where its overrides name none: vLLM where it imports (else the
    embedded engine, hf, with the reason), ``GPU_DEFAULTS``, and on one GPU shared by vLLM and the
    trainer rollout.max_staleness=1 (vLLM outpaces the trainer there, so samples would reach the
    bound, and η = 4 cost held-out accuracy). Returns (overrides to compose with, the lines that
    say so); nothing on the CPU, for Slurm (the GPUs are on the nodes) or on resume."""
    named = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    if cfg.launcher.name != "local" or cfg.resume:
        return [], []
    gpus = [int(g) for g in cfg.cluster.gpus] or visible_gpus()
    if not gpus:
        return [], []  # the CPU: hf, whose slot loop is areal's CPU engine; conf/'s defaults
    extra, lines = [], []
    engine = cfg.engine.name
    if "engine" not in named:
        vllm = spec("vllm")
        try:
            vllm.require()
            engine = "vllm"
            extra.append("engine=vllm")
            lines.append(f"engine=vllm (auto: GPU(s) {gpus} here and vLLM installed; engine=hf "
                         "for the embedded engine)")
        except ValueError:
            lines.append(f"engine=hf (auto: GPU(s) {gpus} here but vLLM is not installed: "
                         f"{vllm.install} for ~10x the generation speed)")
    for key, value in GPU_DEFAULTS.items():
        if key == "trainer.batch_size" and cfg.task.size:
            value = min(value, cfg.task.size)  # a step draws distinct prompts
        if key not in named:
            extra.append(f"{key}={value}")
            lines.append(f"{key}={value} (auto on GPUs; conf/'s default fits a 2-core CPU)")
    one = len(gpus) == 1 and not (cfg.rollout.gpus or cfg.trainer.gpus)
    # a serving engine (GPU only: vLLM) generates several times faster than the trainer trains
    if one and spec(engine).gpu_only and "rollout.max_staleness" not in named:
        extra.append("rollout.max_staleness=1")
        lines.append("rollout.max_staleness=1 (auto on one GPU shared by vLLM and the trainer: "
                     "generation outpaces training there and samples would reach the bound)")
    return extra, lines


def checkpointing_notes(asked: RootConfig, cfg: RootConfig, placement: Placement) -> list[str]:
    """What trainer.activation_checkpointing=auto chose for the trainer, and from what."""
    if asked.trainer.activation_checkpointing != "auto" or not placement.trainer_gpu:
        return []
    _, need = checkpointing(cfg, placement)
    what = ("none" if cfg.trainer.activation_checkpointing == "false" else
            "every layer" if cfg.trainer.checkpoint_every == 1 else
            "every other layer" if cfg.trainer.checkpoint_every == 2 else
            f"every {cfg.trainer.checkpoint_every}th layer")
    if not need:
        return [f"trainer: activation checkpointing {what} (auto: the card or the model's layout "
                "is not known here)"]
    gib = 1024 ** 3
    return [f"trainer: activation checkpointing {what} (auto: ~{need / gib:.0f} GiB estimated per "
            f"trainer GPU of {placement.gpu_memory_bytes / gib:.0f} GiB at "
            f"micro_batch_tokens={cfg.trainer.micro_batch_tokens})"]


def disk_notes(cfg: RootConfig, model_path: Path | None, run_dir: Path) -> list[str]:
    """What the run writes to ``run_dir`` at most (its checkpoints, from the model's layout and the
    trainer's dtypes), against the free space there; a warning where it does not fit, so that a long
    run does not find out at its final save."""
    import shutil

    from areal_cli.config.memory_plan import Layout

    if model_path is None or not (Path(model_path) / "config.json").is_file():
        return []
    try:
        lay = Layout.from_config(model_path)
        params = lay.params
    except (KeyError, TypeError, ValueError):
        return []
    from areal_cli.config.resolve import _states

    t, states = cfg.trainer, _states(cfg)  # the bytes the memory plan counts
    lora = states["lora"]
    # saved as the trainer keeps them: float32 masters; with LoRA the frozen weights' compute dtype
    weight = states["frozen_bytes"] if lora else 4
    moments = 0 if lora else states["moments_bytes"]
    # trainer.lora.merged_checkpoint=false: the final checkpoint is the adapter alone (~nothing
    # but on a mixture of experts' routed experts)
    adapter = lay.expert_io * states["expert_rank"] * 4
    final = params * weight + adapter if not lora or t.lora.merged_checkpoint else adapter
    every = cfg.checkpoint.every
    # trainer checkpoints at every `every`-th version before the last, `keep` of them at once (a
    # stop's checkpoint replaces the final one)
    kept = min(cfg.checkpoint.keep, (t.steps - 1) // every) if every else 0
    parts = [("final checkpoint", final)] if final else []
    if cfg.eval.every:
        parts.append(("evaluation checkpoint", final))
    if kept:
        parts.append((f"{kept} trainer checkpoint{'s' if kept > 1 else ''} (weights and "
                      "optimizer)", kept * params * (weight + moments)))
    need = sum(b for _, b in parts)
    where = Path(run_dir)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    gb = 1e9
    line = (f"disk: the run writes up to ~{need / gb:.1f} GB ("
            + ", ".join(f"{what} ~{b / gb:.1f} GB" for what, b in parts)
            + f"); {where} has {free / gb:.1f} GB free" if parts else
            f"disk: the run's checkpoint is the adapter alone; {where} has {free / gb:.1f} GB free")
    if need <= free:
        return [line]
    return [line, f"disk: WARNING: {need / gb:.1f} GB will not fit in {free / gb:.1f} GB: the run "
                  "would fail when it saves. Free space, set run_dir= to a larger disk, or lower "
                  "checkpoint.keep"]


def resolve_model_for_run(cfg: RootConfig) -> tuple[Path | None, list[str]]:
    """The model's local directory and the lines that say where it comes from. A Hub id is fetched
    (or, with --dry-run, only looked up: None when not cached) and ``cfg.model`` becomes its
    snapshot path, which every process then loads; the architecture is checked wherever
    config.json is here."""
    from areal_cli.architectures import check_supported
    from areal_cli.model_source import hub_model, resolve_model

    hub = hub_model(cfg.model)
    if hub is None:
        path = resolve_model(cfg.model)
        lines = [f"{cfg.model}" if str(path) == cfg.model else f"{cfg.model} → {path}"]
    elif cfg.dry_run:
        path, lines = hub.cached(), hub.plan()
    else:
        path = hub.fetch()
        lines = [f"{hub.repo_id} (revision {hub.revision}) → {path}"]
        cfg.model = str(path)
    if path is not None:
        check_supported(path, f"model={cfg.model}")
    return path, lines


def dtype_notes(asked: RootConfig, cfg: RootConfig, placement: Placement) -> list[str]:
    """The dtype of the trainer and the engine, and why; a warning where an explicit bfloat16 will
    be emulated on a CPU without it (``asked``: the config before it was resolved)."""
    # as resolve_engine decides it: an engine that computes on GPUs only is on one wherever planned
    engine_gpu = placement.engine_gpu or spec(cfg.engine.name).gpu_only
    cpu = None if placement.trainer_gpu and engine_gpu else cpu_dtype.choose()
    lines = []
    for role, key, on_gpu in (("trainer", "trainer.dtype", placement.trainer_gpu),
                              ("engine", "engine.dtype", engine_gpu)):
        chosen, wanted = str(getattr(cfg, role).dtype), str(getattr(asked, role).dtype)
        if on_gpu:
            why = "auto: bfloat16 on a GPU" if wanted == "auto" else "as set"
        elif wanted == "auto":
            why = f"auto on the CPU: {cpu.reason}"
        elif chosen in ("bfloat16", "float16") and not cpu.bf16_native:
            why = (f"as set; WARNING: {cpu.reason}; {key}=auto (or float32) computes in float32, "
                   "several times faster here")
        else:
            why = "as set"
        lines.append(f"{key}={chosen} ({why})")
    return lines + [f"weights.dtype={cfg.weights.dtype} (the wire; auto = engine.dtype)"]


def weight_notes(asked: RootConfig, cfg: RootConfig, model_path: Path | None) -> list[str]:
    """How weights will reach every rollout worker under the resolved ``cfg``, and why
    engine.weight_update is what it is (``asked``: the config before it was resolved)."""
    w, wt = cfg.rollout.workers, cfg.weights
    lora = lora_notes(cfg, model_path)
    if lora and cfg.engine.lora_merge != "true":
        return lora + [f"one {wt.backend} group of {1 + w} ranks (trainer rank 0 + {w} rollout "
                       f"worker(s)), {wt.bucket_mb} MiB buckets"]
    return lora + spec(cfg.engine.name).weight_notes(asked, cfg, model_path)


def lora_notes(cfg: RootConfig, model_path: Path | None) -> list[str]:
    """Which LoRA path the run's weight updates take ([] without LoRA)."""
    lo = cfg.trainer.lora
    if lo.rank <= 0:
        return []
    what = f"LoRA rank {lo.rank}, alpha {lo.alpha:g}, on {','.join(lo.target_modules)}"
    if lo.target_experts:
        what += " and every routed expert (trainer.lora.target_experts)"
    if cfg.engine.lora_merge == "true":
        return [f"{what}: engine.lora_merge=true: the trainer merges the adapter and sends full "
                "weights"]
    size = ""
    if model_path is not None:
        from areal_cli.lora import adapter_size

        size = f" ({adapter_size(model_path, lo) / 2**20:.1f} MiB float32)"
    how = spec(cfg.engine.name).lora_apply
    return [f"{what}: weight updates carry the adapter alone{size}; {how}; every update verified "
            "by a probe's logprobs"]


def length_notes(cfg: RootConfig) -> list[str]:
    """rollout.length_profile checked (ValueError naming the fix) and its draws at this cap."""
    from areal_cli.workflows.length_profile import load_profile

    profile, cap = load_profile(cfg.rollout.length_profile, cfg.seed), cfg.rollout.max_new_tokens
    if profile is None:
        return []
    q = {p: max(1, min(cap, round(profile.fraction(p / 100) * cap))) for p in (10, 50, 90)}
    return [f"rollout.length_profile={profile.name}: each request's max_new_tokens drawn (p10 "
            f"{q[10]}, p50 {q[50]}, p90 {q[90]} of rollout.max_new_tokens={cap}), EOS ignored: "
            "synthetic lengths"]


def make_plan(cfg: RootConfig, gpus: list[int] | None = None,
              placement: Placement | None = None) -> Plan:
    """The plan of ``cfg`` on ``gpus`` (None = the GPUs visible here); its ``cfg`` is ``cfg``
    resolved for the device map, or for ``placement`` (its GPUs; the model is found here) where the
    processes run elsewhere (Slurm's nodes)."""
    cfg = copy.deepcopy(cfg)  # the caller's stays as asked; the plan's is resolved
    # `areal train` creates a fresh directory before planning (rundir.new_run_dir); this name is
    # what --dry-run shows
    run_dir = Path(cfg.run_dir
                   or f"runs/{_dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}").resolve()
    cfg.run_dir = str(run_dir)
    # the ports the controller (and torchrun) will bind: in use → exit 2 before anything starts
    try:
        if cfg.launcher.port_base:
            check_ports(cfg.launcher.host,
                        list(range(cfg.launcher.port_base, cfg.launcher.port_base + 6)))
    except OSError as err:
        raise ValueError(str(err)) from None
    devices = device_map(cfg, gpus)
    shared = shares_rank0_gpu(cfg, devices)
    model_path, model_lines = resolve_model_for_run(cfg)
    total = 0
    if placement is None:
        card = total = gpu_memory(devices["trainer"][:1])
        if shared:  # a rollout worker's engine on rank 0's GPU takes its share first
            card = spec(cfg.engine.name).shared_card(cfg, card, model_path)
        placement = Placement(trainer_gpu=bool(devices["trainer"]),
                              rollout_gpu=bool(devices["rollout"]),
                              shared_gpu=shared, gpu_memory_bytes=card)
    placement = dataclasses.replace(placement, model_path=model_path)
    asked, cfg = cfg, resolve(cfg, placement)
    # concurrent, or alternate where the trainer fits only while the engine sleeps
    if shared and total:
        cfg, placement = choose_share(asked, cfg, placement, total)
    too_big = kv_memory_problems(cfg, model_path, placement.engine_gpu)
    if too_big:
        raise ValueError("\n  - ".join(too_big))
    if shared:
        spec(cfg.engine.name).check_shared_gpu(cfg, devices["trainer"][0])
    cpu_env, alloc_note = allocator_env(cfg.launcher.allocator, asked.launcher.allocator)
    notes = {"model": model_lines, "dtype": dtype_notes(asked, cfg, placement),
             "weights": weight_notes(asked, cfg, model_path), "lengths": length_notes(cfg),
             "memory": [alloc_note, *checkpointing_notes(asked, cfg, placement)],
             "disk": disk_notes(cfg, model_path, run_dir)}
    if shared and total:
        notes["share"] = share_notes(cfg, placement, total, devices["trainer"][0])
    py = sys.executable
    procs = [Proc("controller", [py, "-m", "areal_cli.controller.main", str(run_dir)])]
    served = reward_proc(cfg, run_dir, visible_gpus() if gpus is None else gpus, cpu_env)
    if served:
        notes["reward"] = reward_notes(cfg)
        procs.append(Proc(*served))
        devices["reward"] = [int(g) for g in cfg.reward.gpus]
        idle = [g for g in devices.pop("idle", []) if g not in devices["reward"]]
        devices.update({"idle": idle} if idle else {})
    for i, ids in enumerate(worker_gpus(cfg, devices["rollout"])):
        env = ({"CUDA_VISIBLE_DEVICES": physical_gpus(ids)} if ids
               else {**cpu_env, **ROLLOUT_CPU_ENV})
        procs.append(Proc(f"rollout-{i}",
                          [py, "-m", "areal_cli.rollout.main", str(run_dir), str(i)], env))
    master_port = (cfg.launcher.port_base + 6 if cfg.launcher.port_base
                   else free_ports(cfg.launcher.host, 1)[0])
    tenv = ({"CUDA_VISIBLE_DEVICES": physical_gpus(devices["trainer"])} if devices["trainer"]
            else dict(cpu_env))
    if is_loopback(cfg.launcher.host) and "GLOO_SOCKET_IFNAME" not in os.environ:
        tenv["GLOO_SOCKET_IFNAME"] = "lo"  # the ranks' gloo transport listens on loopback too
    if cfg.trainer.ranks == 1 and not devices["trainer"]:
        # one CPU rank: nothing to rendezvous, and torchrun's agent would hold ~160 MB for the
        # whole run; the rank makes its own single-member gloo group (no store listens on any port)
        tenv.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                    AREAL_SINGLE_RANK="1")
        procs.append(Proc("trainer", [py, "-m", "areal_cli.trainer.main", str(run_dir)], tenv))
    else:  # the ranks' store: a file in the 0700 run directory (launcher/torchrun.py), no TCP store
        tenv["AREAL_RANKS_STORE"] = str(RunDir(run_dir).store(f"ranks-{secrets.token_hex(8)}"))
        procs.append(Proc("trainer", [
            py, "-m", "areal_cli.launcher.torchrun", "--nnodes", "1",
            "--nproc-per-node", str(cfg.trainer.ranks),
            "--rdzv-backend", "areal", "--rdzv-endpoint", f"{cfg.launcher.host}:{master_port}",
            "--rdzv-conf", "rank=0", "-m", "areal_cli.trainer.main", str(run_dir)], tenv))
    return Plan(cfg, run_dir, devices, procs, notes)


ROLLOUT_CPU_ENV = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY":
                   os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")}
"""A CPU rollout worker's oneDNN keeps at most 16 compiled matmuls (default 1024): every decode step
and prefill chunk has a new token count, and the kept primitives grew the worker by ~150 MB in 3
minutes of the default run; generation speed did not measurably change (2-core CPU)."""

def allocator_env(choice: str, asked: str = "") -> tuple[dict, str]:
    """The environment that gives CPU processes the resolved launcher.allocator ``choice``
    (LD_PRELOAD), and a note saying which (``asked``: the value before it was resolved). Torch on
    the CPU frees and reallocates gigabytes a step; glibc's malloc keeps much of it."""
    if choice == "system":
        if asked == "auto":
            return {}, ("allocator: the system's malloc; apt-get install libtcmalloc-minimal4 for "
                        "~0.8 GB less trainer memory and faster CPU steps")
        return {}, "allocator: the system's malloc (launcher.allocator=system)"
    found = find_allocator(choice)
    if not found:
        raise ValueError(f"launcher.allocator={choice}: lib{ALLOCATORS[choice][0]} is not "
                         f"installed: apt-get install {ALLOCATORS[choice][1]}, or use "
                         "launcher.allocator=auto")
    name, lib = found
    preload = " ".join(filter(None, [lib, os.environ.get("LD_PRELOAD", "")]))
    return ({"LD_PRELOAD": preload},
            f"allocator: {name} ({lib}) for the trainer and rollout workers on the CPU")


def child_env(extra: dict) -> dict:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in extra.items()})
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return env

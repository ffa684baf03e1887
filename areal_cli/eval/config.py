"""The typed config of `areal eval` (conf/eval.yaml), its validation and composition.

A separate top-level Hydra config: it shares the `task`, `reward` and `engine` groups with
training, so a task preset and its reward are measured exactly as they are trained. No torch
import here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from areal_cli.config.engine import moved_override_problems
from areal_cli.config.ranges import check_ranges, drop_repeats
from areal_cli.config.read import ConfigError, _schema_message
from areal_cli.config.schema import EngineConfig, WorkflowConfig
from areal_cli.config.task import RewardConfig, TaskConfig
from areal_cli.engines import engines
from areal_cli.engines import unknown as unknown_engine
from areal_cli.rewards.sandbox import sandbox_problems
from areal_cli.runconfig.autos import resolve_engine
from areal_cli.runconfig.compose import (
    _hydra_message,
    apply_task_params,
    conf_dir,
    quote_choices,
    split_task_params,
)
from areal_cli.workflows import workflow_spec
from areal_cli.workflows.agent.checks import agent_problems


@dataclass
class EvalRunConfig:
    """One `areal eval` call: models × tasks."""

    model: str = "smollm2-135m-instruct"
    """Alias, Hugging Face directory, .gguf file, or a run_dir (→ <run_dir>/checkpoints/final)."""
    models: list = field(default_factory=list)
    """Several models in one comparison table; [] = [model]."""
    tasks: list = field(default_factory=list)
    """Task preset names (conf/task/<name>.yaml); [] = [task.name]."""
    n_samples: int = 1
    """k: sampled completions per problem, for avg@k and pass@k; > 1 needs temperature > 0."""
    temperature: float = 0.0
    """0 = greedy decoding only; > 0 = also a sampled pass of n_samples per problem."""
    top_p: float = 1.0
    """Nucleus sampling of the sampled pass (1.0 = off)."""
    greedy: bool = True
    """Run the greedy pass (accuracy) also when temperature > 0."""
    max_new_tokens: int = 64
    """Generated tokens per completion; a completion that reaches it counts as truncated."""
    size: int = 0
    """Problems per task: the first `size` of the eval split (0 = all of it). With a run_dir as
    model, problems found in that run's training split are dropped first (and reported)."""
    out_dir: str = ""
    """Where eval.json and eval.md go; "" = runs/eval-<timestamp>."""
    seed: int = 0
    """Seed of the sampled pass."""
    threads: int = 0
    """torch CPU threads (of each worker); 0 = every core (data-parallel: the cores divided among
    workers)."""
    max_concurrent: int = 64
    """Sequences generating at once in the engine (the KV cache is sized for them); with engine=vllm
    raise it (e.g. 256): vLLM schedules and sizes its KV cache itself."""
    gpus: list = field(default_factory=list)
    """GPU ids for data-parallel evaluation: the problems of every task are split into one
    contiguous shard per worker process, each process sees only its GPU(s) (CUDA_VISIBLE_DEVICES;
    with engine=vllm engine.vllm.tensor_parallel_size GPUs each), and the samples are merged into
    one eval.json. [] = one process on the default device."""
    workers: int = 0
    """Evaluation processes, one shard each; 0 = one per GPU of `gpus` (1 without gpus). More
    workers than GPUs share them round-robin; workers > 1 without gpus = processes on the default
    device (on a CPU machine: CPU processes with cores / workers torch threads each unless `threads`
    is set)."""
    timeout_s: float = 3600.0
    """Longest one evaluation may go without finishing a sequence or scoring a completion, and
    longest a data-parallel worker (one shard) may run; past it the evaluation stops with an error
    naming the shard. 0 = no limit."""
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    """single_turn (the default) or agent: `workflow=agent workflow.agent=module:function` runs the
    agent greedily on each problem through the engine's endpoint; the task's reward scores its last
    reply."""

    def model_list(self) -> list[str]:
        return [str(m) for m in self.models] or [self.model]

    def validate(self) -> list[str]:
        generic = check_ranges(self)
        return generic + drop_repeats(generic, self._cross_field())

    def _cross_field(self) -> list[str]:
        problems = self.task.validate() + self.reward.validate() + sandbox_problems(self.reward,
                                                                                    self.task)
        if self.reward.served or len(self.reward.parts) > 1:
            problems.append(f"reward.fn={self.reward.fn}: areal eval scores with one verifier "
                            "(auto, math_verify, exact, numeric, code or module:function); model "
                            "and judge rewards run inside areal train")
        if self.n_samples < 1:
            problems.append(f"n_samples={self.n_samples}: must be >= 1")
        if self.temperature < 0:
            problems.append(f"temperature={self.temperature}: must be >= 0 (0 = greedy)")
        if self.temperature == 0 and self.n_samples > 1:
            problems.append(f"n_samples={self.n_samples} with temperature=0: greedy decoding gives "
                            "one answer per problem; set temperature>0 (e.g. temperature=0.6) for "
                            "pass@k")
        if self.temperature == 0 and not self.greedy:
            problems.append("greedy=false with temperature=0 runs nothing: set temperature>0 or "
                            "greedy=true")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p={self.top_p}: must be in (0, 1]")
        for key in ("max_new_tokens", "max_concurrent"):
            if getattr(self, key) < 1:
                problems.append(f"{key}={getattr(self, key)}: must be >= 1")
        if self.size < 0:
            problems.append(f"size={self.size}: must be >= 0 (0 = task.eval_size)")
        if self.task.eval_size and self.size > self.task.eval_size:
            problems.append(f"size={self.size} > task.eval_size={self.task.eval_size}: raise "
                            f"task.eval_size={self.size} or lower size")
        if unknown_engine(self.engine.name):
            problems.append(unknown_engine(self.engine.name))
        if self.workers < 0:
            problems.append(f"workers={self.workers}: must be >= 0 (0 = one per GPU of gpus, else "
                            "1)")
        problems += self._gpu_problems()
        workflow = workflow_spec(self.workflow.name)
        if not workflow.in_eval:
            problems.append(f"workflow={self.workflow.name}: areal eval runs single_turn or agent")
        elif workflow.runs_agent and agent_problems(self.workflow, True):
            problems += agent_problems(self.workflow, True)
        elif workflow.runs_agent and (self.temperature > 0 or self.data_parallel()):
            problems.append("workflow=agent is evaluated greedily in one process: drop "
                            "temperature, gpus and workers")
        return problems

    def _gpu_problems(self) -> list[str]:
        try:
            gpus = [int(g) for g in self.gpus]
        except (TypeError, ValueError):
            return [f"gpus={list(self.gpus)}: must be GPU ids, e.g. gpus=[0,1]"]
        out = []
        if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
            out.append(f"gpus={gpus}: must be distinct GPU ids >= 0")
        tp = self.gpus_per_worker()
        if gpus and len(gpus) % tp:
            out.append(f"gpus={gpus} with engine.vllm.tensor_parallel_size={tp}: give a multiple "
                       f"of {tp} GPUs (each worker takes tensor_parallel_size of them)")
        return out

    def gpus_per_worker(self) -> int:
        """GPUs of one worker process: vLLM's tensor-parallel size, else 1."""
        engine = engines().get(self.engine.name)
        tp = self.engine.vllm.tensor_parallel_size
        return max(1, tp) if engine and engine.tensor_parallel else 1

    def worker_count(self) -> int:
        """Data-parallel worker processes: ``workers``, else one per GPU slot, else 1."""
        return self.workers or max(1, len(self.gpus) // self.gpus_per_worker())

    def worker_gpus(self, k: int) -> list[int]:
        """The GPU ids of worker ``k`` ([] = no GPU pinned: the default device)."""
        if not self.gpus:
            return []
        tp = self.gpus_per_worker()
        slot = k % max(1, len(self.gpus) // tp)
        return [int(g) for g in self.gpus[slot * tp:(slot + 1) * tp]]

    def data_parallel(self) -> bool:
        """Whether the evaluation runs in worker processes (gpus given or workers > 1)."""
        return bool(self.gpus) or self.worker_count() > 1


def compose_eval(overrides: list[str]) -> list[EvalRunConfig]:
    """One validated EvalRunConfig per task of the call (the `tasks=` list, else `task=`)."""
    base = _compose(overrides)
    if not base.tasks:
        return [base]
    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("task", "tasks")]
    return [replace(_compose(rest + [f"task={name}"]), tasks=list(base.tasks))
            for name in base.tasks]


def _compose(overrides: list[str]) -> EvalRunConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if moved := moved_override_problems(overrides):  # engine.max_model_len=...: its new place
        raise ConfigError(moved)
    rest, params = split_task_params(quote_choices(list(overrides), EvalRunConfig))
    try:
        with initialize_config_dir(str(conf_dir()), version_base=None):
            raw = hydra_compose(config_name="eval", overrides=rest)
        apply_task_params(raw, rest, params, "eval")
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError([_for_eval(_hydra_message(err))]) from None
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EvalRunConfig), raw))
    except OmegaConfBaseException as err:
        raise ConfigError([_for_eval(_schema_message(err))]) from None
    problems = cfg.validate()
    if problems:
        raise ConfigError(problems)
    # no launcher plans an evaluation
    return replace(cfg, engine=resolve_engine(cfg.engine, updates=False))


def _for_eval(message: str) -> str:
    """A load.py message with the fix `areal eval` users need."""
    message = message.replace("`areal train --dry-run` prints every valid key",
                              "conf/eval.yaml lists every key")
    if "Could not find 'task/" in message:
        presets = sorted(p.stem for p in (conf_dir() / "task").glob("*.yaml"))
        return message.split(" (see")[0] + f" (task presets: {', '.join(presets)})"
    return message

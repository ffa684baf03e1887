"""Typed schema of the `task` and `reward` config groups (no torch, no heavy imports)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from areal_cli.config.reward_models import (
    MODEL_PARTS,
    JudgeConfig,
    RewardModelConfig,
    judge_problems,
    part_name,
    reward_parts,
)

TASK_SOURCES = ("reasoning_gym", "file", "hf_disk", "humaneval")
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
SANDBOXES = ("bwrap", "unsafe_none")
REWARD_FNS = ("auto", "reasoning_gym", "math_verify", "exact", "numeric", "code")

DEFAULT_INSTRUCTION = (
    "Think briefly, then give your final answer on the last line as 'Answer: <number>'."
)


def plain(value):
    """OmegaConf containers (or any mapping/sequence) as plain dicts/lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [plain(v) for v in value]
    return value


def rg_options(dataset: str) -> list[str]:
    """The params a reasoning-gym dataset takes: its config's fields but size and seed."""
    from reasoning_gym.factory import DATASETS

    return [f.name for f in fields(DATASETS[dataset][1]) if f.name not in ("size", "seed")]


@dataclass
class TaskConfig:
    """Where problems come from and how they are phrased."""

    name: str = "basic_arithmetic"
    """Preset name; also the prefix of every problem id ("<name>/<split>/<index>"); "" = the
    reasoning-gym dataset's name (the source's name for other sources)."""
    source: str = "reasoning_gym"
    """One of "reasoning_gym" | "file" (JSONL/JSON/Parquet) | "hf_disk" | "humaneval"."""
    dataset: str = "basic_arithmetic"
    """reasoning-gym dataset name (source "reasoning_gym" only)."""
    params: dict = field(default_factory=dict)
    """reasoning_gym.create_dataset options; {} = the dataset's defaults. `task.params.<key>=<v>`
    adds or sets one; a task.dataset other than the preset's starts from {} (`areal tasks <name>`
    lists a dataset's options)."""
    size: int = 2000
    """Training problems; for file/hf_disk/humaneval at most this many (0 = all that remain)."""
    eval_size: int = 64
    """Held-out problems (distinct by content); 0 = eval_fraction of the task's problems. With
    eval_path: the first eval_size of that file's distinct problems (0 = all of them)."""
    eval_fraction: float = 0.1
    """Used only when eval_size is 0: hold out this fraction (at least one) of a file's distinct
    problems (of HumanEval's 164; of task.size for a generated task)."""
    eval_share: float = 0.2
    """Generated tasks (reasoning-gym): the fraction of the problem space (by a stable hash of each
    problem's content) reserved for eval; training never draws from it. Raise it for small
    spaces."""
    path: str = ""
    """File (.jsonl/.json/.parquet) or `datasets.save_to_disk` directory (file, hf_disk)."""
    eval_path: str = ""
    """Optional separate eval file/directory; empty = hold eval_size out of `path`."""
    prompt_field: str = "prompt"
    """Record field holding the question text (file, hf_disk)."""
    answer_field: str = "answer"
    """Record field holding the reference answer (file, hf_disk)."""
    id_field: str = ""
    """Record field holding a unique id; empty = "<name>/<index in the file>"."""
    system_prompt: str = ""
    """System message prepended to every conversation; empty = none."""
    instruction: str = DEFAULT_INSTRUCTION
    """Answer-format instruction appended to every prompt; empty = none."""
    seed: int = 0
    """Train generator/shuffle seed; eval uses a seed derived from it, so problems differ."""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = self.dataset if self.source == "reasoning_gym" else self.source

    def held_out_count(self, total: int) -> int:
        """Problems to hold out of ``total``: eval_size, or eval_fraction of it (at least 1) when
        0."""
        return self.eval_size if self.eval_size > 0 else max(1, round(self.eval_fraction * total))

    def validate(self) -> list[str]:
        errors = []
        if not 0 < self.eval_fraction < 1:
            errors.append(f"task.eval_fraction={self.eval_fraction}: must be in (0, 1), e.g. 0.1")
        if not 0 < self.eval_share < 1:
            errors.append(f"task.eval_share={self.eval_share}: must be in (0, 1), e.g. 0.2")
        if self.source not in TASK_SOURCES:
            errors.append(f"task.source={self.source!r}: use one of {', '.join(TASK_SOURCES)}")
        if self.size < 0 or self.eval_size < 0:
            errors.append("task.size / task.eval_size must be >= 0: set a non-negative count")
        if self.source == "reasoning_gym":
            errors += self._validate_reasoning_gym()
        if self.source in ("file", "hf_disk"):
            errors += self._validate_path("path", self.path, required=True)
            errors += self._validate_path("eval_path", self.eval_path, required=False)
            if not self.prompt_field or not self.answer_field:
                errors.append("task.prompt_field / task.answer_field: name the record fields")
        return errors

    def _validate_reasoning_gym(self) -> list[str]:
        if self.size == 0:
            return ["task.size=0: reasoning-gym generates problems; set task.size > 0"]
        if importlib.util.find_spec("reasoning_gym") is None:
            return ["task.source=reasoning_gym needs the package: pip install reasoning-gym"]
        from reasoning_gym.factory import DATASETS

        if not self.dataset:
            return ["task.dataset is empty: set task.dataset=<name> (`areal tasks` lists "
                    "reasoning-gym's datasets)"]
        if self.dataset not in DATASETS:
            import difflib

            close = difflib.get_close_matches(self.dataset, list(DATASETS), n=4, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            return [f"task.dataset={self.dataset!r} is not a reasoning-gym dataset: {hint}"
                    f"the {len(DATASETS)} datasets are: {', '.join(sorted(DATASETS))} "
                    "(`areal tasks`)"]
        return self._validate_params(DATASETS[self.dataset][1])

    def _validate_params(self, config_cls) -> list[str]:
        """Every key an option of the dataset's config, and the values its own checks accept."""
        params, valid = plain(self.params), rg_options(self.dataset)
        unknown = [k for k in params if k not in valid]
        if unknown:
            return [f"task.params.{k} is not an option of reasoning-gym {self.dataset!r}; its "
                    f"options: {', '.join(valid)} (task.size / task.seed set size and seed)"
                    for k in unknown]
        try:
            config = config_cls(**params)
            if hasattr(config, "validate"):
                config.validate()
        except (AssertionError, ValueError, TypeError) as e:
            return [f"task.params={params} rejected by reasoning-gym {self.dataset!r}: "
                    f"{e or type(e).__name__}. Its options: {', '.join(valid)} "
                    f"(`areal tasks {self.dataset}` shows their defaults)"]
        return []

    def _validate_path(self, key: str, value: str, required: bool) -> list[str]:
        if not value:
            return [f"task.{key} is empty: set task.{key}=/path/to/data"] if required else []
        p = Path(value).expanduser()
        if not p.exists():
            return [f"task.{key}={value!r} does not exist: give an existing path"]
        if self.source == "file" and p.suffix not in FILE_SUFFIXES:
            return [f"task.{key}={value!r}: file must end in {', '.join(FILE_SUFFIXES)}"]
        if self.source == "hf_disk" and not p.is_dir():
            return [f"task.{key}={value!r}: hf_disk needs a datasets.save_to_disk directory"]
        return []


@dataclass
class RewardConfig:
    """How a completion is scored, and the limits of the reward worker pool and sandbox."""

    fn: Any = "auto"
    """"auto" (by problem) | reasoning_gym | math_verify | exact | numeric | code |
    "module:function" (verifiers) | model (reward.model) | judge (reward.judge) | a list of them,
    e.g. [auto, judge]: the reward is their sum weighted by reward.weights, each part logged as
    reward_<part>_mean."""
    weights: list = field(default_factory=list)
    """Weight of each part of reward.fn, in its order; [] = 1 for every part."""
    max_error_fraction: float = 0.5
    """The run stops, naming the process that scores it, when more than this fraction of a batch's
    samples failed (timeout, error, or a judge's unparseable verdict) in one reward part; 1 =
    never."""
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """reward.fn=model: the sequence-classification reward model."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """reward.fn=judge: the generative judge."""
    batch_size: int = 16
    """reward.fn=model / judge: most requests the reward-model process scores in one forward."""
    batch_wait_s: float = 0.05
    """reward.fn=model / judge: how long the reward-model process gathers requests (from every
    rollout worker) after the first before it scores them."""
    gpus: list = field(default_factory=list)
    """reward.fn=model / judge: GPU ids of the reward-model process; [] = the CPU."""
    dtype: str = "auto"
    """reward.fn=model / judge: weights of the reward model and judge: auto | bfloat16 | float16 |
    float32; auto = bfloat16 on reward.gpus, on the CPU the dtype it computes natively
    (config/cpu_dtype.py: float32 where bfloat16 would be emulated)."""
    partial_credit: bool = False
    """reasoning_gym: pay the dataset's graded score_answer (e.g. len(reference)/len(answer) when
    the reference occurs inside the answer); false = only a correct answer earns reward (1), else
    0."""
    timeout_s: float = 10.0
    """Per-call limit in the reward pool, and of a model-based part's call from when the
    reward-model process takes it (a call queued behind others there waits up to 10× as long to be
    taken); a call past it scores 0 with status "timeout"."""
    workers: int = 2
    """Reward worker processes per rollout worker."""
    numeric_tol: float = 1e-6
    """Absolute and relative tolerance of the "numeric" scorer."""
    code_cpu_s: int = 5
    """CPU seconds of one sandboxed call, all its processes together."""
    code_wall_s: float = 8.0
    """Wall seconds before a sandboxed call's whole process tree is killed."""
    code_mem_mb: int = 1024
    """MiB of one sandboxed call: its processes' Pss plus its /tmp files (and each one's
    RLIMIT_AS)."""
    code_nproc: int = 32
    """Processes of one sandboxed call, all together (its own user namespace or uid)."""
    sandbox: str = "bwrap"
    """Isolation of model-written code: "bwrap" (bubblewrap; missing = exit 2 naming the package)
    | "unsafe_none" (no isolation at all: an explicit opt-in, logged at start and per result)."""

    def _machine_problems(self) -> list[str]:
        """Sandbox limits above what this machine has would never bind: refused, naming the
        most."""
        from areal_cli.config.machine import memory_mb, tasks_max

        errors = []
        if self.code_mem_mb > memory_mb():
            errors.append(f"reward.code_mem_mb={self.code_mem_mb}: must be at most this "
                          f"machine's memory, {memory_mb()} MiB (a larger limit never binds): "
                          "lower it")
        if self.code_nproc > tasks_max():
            errors.append(f"reward.code_nproc={self.code_nproc}: must be at most the "
                          f"{tasks_max()} tasks this machine's kernel allows (a larger limit never "
                          "binds): lower it")
        return errors

    @property
    def parts(self) -> list[str]:
        """reward.fn as a list of its parts."""
        return reward_parts(self.fn)

    @property
    def served(self) -> bool:
        """Whether a part needs the reward-model process (model or judge)."""
        return any(p in MODEL_PARTS for p in self.parts)

    def verifier(self) -> RewardConfig | None:
        """This config with fn = its verifier part (what a RewardPool and evaluation score); None
        if none."""
        found = [p for p in self.parts if p not in MODEL_PARTS]
        return dataclasses.replace(self, fn=found[0]) if found else None

    def validate(self) -> list[str]:
        errors = self._validate_parts()
        for key in ("timeout_s", "workers", "code_cpu_s", "code_wall_s", "code_mem_mb"):
            if getattr(self, key) <= 0:
                errors.append(f"reward.{key}={getattr(self, key)} must be > 0: raise it")
        if self.code_nproc < 1:
            errors.append(f"reward.code_nproc={self.code_nproc} must be >= 1: raise it")
        errors += self._machine_problems()
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            errors.append(f"reward.dtype={self.dtype!r}: use auto, bfloat16, float16 or float32")
        if self.sandbox not in SANDBOXES:
            errors.append(f"reward.sandbox={self.sandbox!r}: use one of {', '.join(SANDBOXES)}")
        if self.numeric_tol < 0:
            errors.append(f"reward.numeric_tol={self.numeric_tol} must be >= 0")
        if {"auto", "code"} & set(self.parts) and self.timeout_s <= self.code_wall_s:
            errors.append(
                f"reward.timeout_s={self.timeout_s} <= reward.code_wall_s={self.code_wall_s}: "
                "the pool would kill code runs first; set timeout_s above code_wall_s"
            )
        if self.code_wall_s <= self.code_cpu_s * 0.5:
            errors.append("reward.code_wall_s is far below code_cpu_s: set it >= code_cpu_s")
        return errors

    def _validate_parts(self) -> list[str]:
        parts = self.parts
        if not parts:
            return ["reward.fn=[] scores nothing: name at least one part, e.g. reward.fn=auto"]
        known = REWARD_FNS + MODEL_PARTS
        errors = [f"reward.fn={p!r}: use one of {', '.join(known)}, an import path "
                  "'my_module:my_fn', or a list of them" for p in parts
                  if p not in known and ":" not in p]
        names = [part_name(p) for p in parts]
        if len(set(names)) < len(names):
            errors.append(f"reward.fn={parts}: at most one verifier, one model and one judge; "
                          "drop the repeat")
        weights = list(self.weights)
        if not all(isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w)
                   for w in weights):
            errors.append(f"reward.weights={weights}: every weight must be a finite number")
        elif weights and len(weights) != len(parts):
            errors.append(f"reward.weights={weights} has {len(weights)} entries for the "
                          f"{len(parts)} parts of reward.fn={parts}: give one weight per part, or "
                          "[] for all 1")
        if "model" in parts and not self.model.path:
            errors.append("reward.fn includes model but reward.model.path is empty: set it to the "
                          "reward model's directory or Hub id")
        if "judge" in parts:
            errors += judge_problems(self.judge, self.gpus)
        return errors

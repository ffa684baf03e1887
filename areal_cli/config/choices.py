"""The closed choices of the config, as enums: OmegaConf refuses any other value when it merges the
config, naming the valid ones (``load.py`` turns that into "key=value: use a, b or c").

A field whose enum has ``auto`` is resolved to a concrete member once, when the launcher plans the
run (``config/resolve.py``); the run's config.yaml and every process see only concrete members.
StrEnum members compare equal to their strings (``Dtype.bfloat16 == "bfloat16"``). No torch here.
"""

from __future__ import annotations

from enum import Enum, StrEnum


class Dtype(StrEnum):
    """A torch floating-point dtype by name; auto = bfloat16 (weights.dtype: the engine's)."""

    auto = "auto"
    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


class OptimState(StrEnum):
    """dtype of AdamW's moments; auto = bfloat16 on the CPU, float32 on GPUs."""

    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"


class LrDecay(StrEnum):
    """The learning rate after warm-up, over the run's steps: constant, or down to
    ``trainer.min_lr_ratio`` × lr at the last step along a straight line or a half cosine."""

    constant = "constant"
    linear = "linear"
    cosine = "cosine"


class WeightUpdate(StrEnum):
    """How a vLLM engine loads new weights; auto = inplace where the layout is known, else
    reload."""

    auto = "auto"
    reload = "reload"
    inplace = "inplace"


class Switch(StrEnum):
    """On, off, or auto (decided from the rest of the config). A CLI ``key=true`` is taken as the
    word, not YAML's boolean (``load.py`` quotes it)."""

    auto = "auto"
    true = "true"
    false = "false"


class WeightsBackend(StrEnum):
    """Backend of the weight broadcast; auto = NCCL between GPUs, CUDA IPC where a rollout worker
    shares trainer rank 0's GPU, else gloo."""

    auto = "auto"
    nccl = "nccl"
    gloo = "gloo"
    ipc = "ipc"


class Allocator(StrEnum):
    """malloc of CPU processes; auto = tcmalloc, else jemalloc, else the system's (what is
    installed)."""

    auto = "auto"
    tcmalloc = "tcmalloc"
    jemalloc = "jemalloc"
    system = "system"


class WandbMode(StrEnum):
    """W&B mode; auto = WANDB_MODE if set, else online where an API key is configured, else
    offline."""

    auto = "auto"
    online = "online"
    offline = "offline"
    disabled = "disabled"


class CpuBatching(StrEnum):
    """hf on the CPU: areal's slot loop over one contiguous KV cache | transformers' paged
    continuous batching."""

    slots = "slots"
    paged = "paged"


class PauseMode(StrEnum):
    """vLLM on a weight update: abort (re-prefill unfinished sequences) | keep (keep their KV)."""

    abort = "abort"
    keep = "keep"


class Share(StrEnum):
    """How the trainer and an engine on one device take turns: concurrent | alternate."""

    auto = "auto"
    concurrent = "concurrent"
    alternate = "alternate"


class BatchOrder(StrEnum):
    """Which groups make a batch: the oldest finished | the oldest admitted."""

    finished = "finished"
    admission = "admission"


class LauncherName(StrEnum):
    """Where the run's processes start: this machine | a Slurm job."""

    local = "local"
    slurm = "slurm"


def listed(choices: type[Enum]) -> str:
    """``"a, b or c"``: the members of ``choices``, for an error message."""
    names = [m.value for m in choices]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


class AgentCredit(StrEnum):
    """workflow=agent: which trajectories of an episode of several train with its advantage."""

    shared = "shared"
    last = "last"


class FailedEpisode(StrEnum):
    """workflow=agent: a group with a failed episode is dropped whole | trains, each failed
    episode's recorded calls at reward 0."""

    drop_group = "drop_group"
    reward_zero = "reward_zero"


class ConstrainedTokens(StrEnum):
    """workflow=agent: the tokens of a reply decoded under a grammar (a required tool call, a
    response format): trained with their masked behaviour logprobs | kept out of the loss."""

    train = "train"
    mask = "mask"


class AgentReward(StrEnum):
    """workflow.agent_cmd: where a program's episode reward comes from: the task's reward on its
    last reply | the file it writes (AREAL_REWARD_FILE) | workflow.agent_verifier_cmd's output."""

    task = "task"
    file = "file"
    verifier = "verifier"


class ToolFormat(StrEnum):
    """workflow=agent: the text format of the model's tool calls; template = chosen from the
    model's chat template when the rollout worker starts (a property of the model, not of the
    placement)."""

    template = "template"
    hermes = "hermes"
    llama3_json = "llama3_json"

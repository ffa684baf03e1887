"""The typed config of a run: one dataclass per role, every field documented.

``conf/`` holds values only; Hydra composes it with the user's ``key=value`` overrides and
``areal_cli.runconfig.compose`` merges the result into ``RootConfig``, so unknown keys and wrong
types are errors; a closed choice is an enum (``choices.py``), so a value outside it is an error
naming the valid ones. Every ``auto`` is resolved once, when the launcher plans the run
(``resolve.py``): the run's config.yaml holds concrete values only. No torch import here:
``areal --help`` stays instant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_cli.config.algorithm import AlgorithmConfig
from areal_cli.config.choices import (
    Allocator,
    BatchOrder,
    Dtype,
    LauncherName,
    LrDecay,
    OptimState,
    Share,
    Switch,
    WandbMode,
    WeightsBackend,
)
from areal_cli.config.engine import EngineConfig
from areal_cli.config.task import RewardConfig, TaskConfig
from areal_cli.config.workflow import WorkflowConfig


@dataclass
class RolloutConfig:
    """Rollout workers and the asynchronous admission rule."""

    workers: int = 1
    """Rollout worker processes (one engine each)."""
    group_size: int = 4
    """Samples per prompt (G): one group = G trajectories of the same prompt."""
    max_new_tokens: int = 64
    """Generated tokens per turn."""
    max_staleness: int = 4
    """η: a trained sample started at most η policy versions before the trainer's version. 0 =
    synchronous RL."""
    max_concurrent: int = 0
    """Prompt groups generating at once over all workers; 0 = (η+1)·trainer.batch_size."""
    temperature: float = 1.0
    """Sampling temperature (the trainer divides logits by it too)."""
    top_p: float = 1.0
    """Nucleus sampling (1.0 = off; behaviour logprobs are then of the truncated distribution)."""
    gpus: list = field(default_factory=list)
    """GPU ids for generation (one worker per GPU); [] = from cluster.gpus."""
    batch_order: BatchOrder = BatchOrder.finished
    """"finished": a batch is the B oldest finished groups (training never waits for a slow group) |
    "admission": the B oldest admitted prompts, waiting for them (reproducible prompt sets, exact
    resume)."""
    length_profile: str = ""
    """Benchmarks with random weights: each request's max_new_tokens drawn from this response-length
    distribution and EOS ignored. "" = off | "arithmetic_long" (measured long tail, scaled to
    max_new_tokens) | "fixed" (every response max_new_tokens long) | a JSON file
    (areal_cli/workflows/length_profile.py)."""


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""The attention and MLP projections of Llama / Mistral / Qwen2 / Qwen3 layouts."""


@dataclass
class LoraConfig:
    """Low-rank adapters (LoRA, built with peft) instead of full fine-tuning: only the adapters
    train and only they travel to the engines (docs: README "LoRA")."""

    rank: int = 0
    """Adapter rank r; 0 = full fine-tuning (no adapter)."""
    alpha: float = 32.0
    """Scale numerator: the update is (alpha / rank) · B·A."""
    dropout: float = 0.0
    """Dropout on the adapter's input in training (0 keeps the trainer's logprobs equal to the
    engine's)."""
    target_modules: list = field(default_factory=lambda: list(LORA_TARGETS))
    """Names of the linear layers that get an adapter (the last part of the module name)."""
    target_experts: bool = False
    """A mixture of experts: an adapter on every routed expert's weights too (each expert its own
    rank-r A and B on its gate/up and down projections, peft's parameter wrappers); needs
    dropout=0 and merged weight updates (engine.lora_merge auto or true). false: only the linear
    layers of target_modules (attention, a shared expert)."""
    merged_checkpoint: bool = True
    """The final checkpoint holds the model with the adapter merged (loads as a plain model; the
    size of the whole model) beside ``adapter/``; false: ``adapter/`` alone, with the base model's
    path in its config (for a model whose merged copy would not fit the disk; needs
    eval.at_end=false and eval.every=0, which score a merged checkpoint)."""


@dataclass
class TrainerConfig:
    """torchrun FSDP2 trainer ranks."""

    ranks: int = 1
    """Trainer processes (torchrun --nproc-per-node); the batch's samples are split among them."""
    steps: int = 50
    """Optimizer steps (= policy versions) of the run."""
    batch_size: int = 8
    """B: prompt groups per step."""
    lr: float = 5e-6
    """AdamW learning rate."""
    optim_state: OptimState = OptimState.auto
    """AdamW's moments: "float32" | "bfloat16" (stochastically rounded: 4 bytes a parameter less,
    a little slower per step) | "auto" (bfloat16 on the CPU, float32 on GPUs)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps."""
    lr_decay: LrDecay = LrDecay.constant
    """After warm-up: "constant" | "linear" | "cosine" (down to min_lr_ratio × lr at the run's last
    optimizer step: steps × algorithm.ppo_epochs)."""
    min_lr_ratio: float = 0.0
    """The decayed learning rate at the last step, as a fraction of lr (lr_decay linear or
    cosine)."""
    grad_clip: float = 1.0
    """Max gradient norm."""
    micro_batch_tokens: int = 4096
    """Token budget of one forward/backward micro-batch (sequences are packed up to it)."""
    packing: Switch = Switch.auto
    """Pack sequences into micro-batches without padding ("false" = pad each micro-batch); "auto":
    true for a trainer on GPUs, false on the CPU (a packed row needs a dense block mask there, which
    CPU SDPA runs at O(T²))."""
    shared_prompts: Switch = Switch.auto
    """Lay out the samples of a group once per prompt: one row holds the prompt then each of its
    responses, every response attending to the prompt and to itself (the same logprobs and
    gradients as a row per sample), so a group of G samples runs its prompt's tokens once instead of
    G times. "auto": true on the CPU (where the prompt is most of a row's tokens and the step is
    bound by the arithmetic), false on GPUs (packed rows there); off with packing and with MoE
    routing replay."""
    varlen: bool = True
    """Packed micro-batches on CUDA: FlashAttention over each sequence (torch's varlen_attn) instead
    of SDPA with a dense block mask (which rules FlashAttention out); no effect on the CPU or
    without it."""
    dtype: Dtype = Dtype.auto
    """Autocast compute dtype: "auto" (bfloat16) | "bfloat16" | "float16" (with dynamic loss
    scaling) | "float32". Master weights stay float32."""
    activation_checkpointing: Switch = Switch.auto
    """Recompute decoder layers' activations in backward (less memory, about a third more compute
    for every layer). "auto": true on the CPU; on GPUs the least recomputation whose estimated peak
    fits the trainer's card (none, every other layer, every layer; config/memory_plan.py), which
    also sets checkpoint_every; printed at start."""
    checkpoint_every: int = 1
    """With activation_checkpointing: recompute every k-th decoder layer only (1 = all; 2 = every
    other: half the recomputation, the other layers' activations held)."""
    compile: Switch = Switch.auto
    """torch.compile each decoder layer (fused norms, rotary and activations): "auto" (true for the
    trainer on GPUs with a dense model of 1B decoder-layer parameters or more; false on the CPU and
    for a mixture of experts, whose layers traced for minutes) | "true" | "false". The trainer
    compiles for every form of input its steps can meet (one packed row or several, segment
    offsets, an empty micro-batch) before its first batch, while the engines start (tens of seconds
    a form); compiled_graphs in metrics.jsonl counts any a step compiled still."""
    shard: Switch = Switch.auto
    """FSDP2 over the trainer's ranks. "auto": true, except for one rank that would shard nothing:
    on the CPU, and on one GPU for a model under 1B decoder-layer parameters, every expert counted
    (``SHARD_MIN_PARAMS``), whose step is bound by the host, which FSDP's per-layer gathers, casts
    and hooks lengthen (BENCHMARKS.md "One GPU"); there the weights stay float32 under bfloat16
    autocast. "false" needs trainer.ranks=1."""
    reshard_after_forward: bool = True
    """FSDP2: free each layer's gathered parameters after its forward and gather them again for the
    backward; false keeps them gathered until the backward (one all-gather less per layer and
    micro-batch, more memory)."""
    threads: int = 0
    """torch CPU threads per rank; 0 = half the cores (at least 1)."""
    skip_zero_advantage: bool = True
    """Leave rows whose every advantage is 0 out of the policy's forward/backward (exactly 0
    gradient; not with a KL or entropy term in the loss); counted in skipped_rows /
    skipped_tokens."""
    logprob_chunk_tokens: int = 0
    """Positions whose output layer and log-softmax run at once (the [tokens, vocab] logits are
    never held for a whole micro-batch); 0 = auto: 256 on the CPU, 2048 on GPUs (fewer, larger
    kernels)."""
    shape_buckets: int = 4
    """Padded micro-batches' rows and columns (and the output layer's last chunk) rounded up to this
    many sizes per doubling, so CPU caches see few shapes (less memory growth); 0 = exact shapes."""
    peak_flops: float = 0.0
    """Peak FLOP/s of one rank's device for the mfu metric; 0 = the card's from a table of known
    cards (trainer/metrics.py), none on CPU."""
    max_nonfinite_steps: int = 5
    """Steps in a row whose gradient norm is not finite (each skipped, the weights kept) after which
    the trainer stops the run with an error naming the parameters; 0 = never. A float16 run, whose
    loss scale halves at each overflow, does not count."""
    detect_anomaly: bool = False
    """Find where a non-finite gradient starts: every micro-batch's forward and backward run under
    torch.autograd.detect_anomaly, and the first operation whose backward returns NaN stops the
    trainer, named, with the stack of its forward in the trainer's log. Slow; for diagnosis only."""
    gpus: list = field(default_factory=list)
    """GPU ids for training; [] = from cluster.gpus."""
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class WeightsConfig:
    """Trainer rank 0 → rollout workers weight broadcast."""

    bucket_mb: int = 0
    """Bucket size in MiB; the next bucket is gathered while the previous one is on the wire. 0 =
    1024 with NCCL, 32 with gloo (host memory: a rollout worker holds two buckets while it
    receives)."""
    dtype: Dtype = Dtype.auto
    """Wire dtype: "auto" = the engine's dtype."""
    verify: bool = False
    """Both ends hash the weights after each update (sha256 in metrics.jsonl); for tests and
    debugging."""
    staged: Switch = Switch.auto
    """"true": cast the whole update into wire buffers before the workers pause (shorter pause;
    trainer rank 0 keeps one extra copy of the weights in the wire dtype, 15 GB at 7B). "false": two
    bucket buffers, gathered while the previous bucket is on the wire (engine=vllm: each parameter
    gathered from the shards and sent in turn); for a model whose shards and that copy do not fit
    beside each other. "auto": true with nccl and ipc, false with gloo (host memory)."""
    high_priority: bool = True
    """NCCL, engine=vllm with engine.weight_update=inplace: the broadcast and a staged receive's
    copies run on CUDA streams of the highest priority, so a receive behind generation gets the
    GPU's free SMs before generation's next kernels do (the receive is short; generation slows for
    its length). false: streams of normal priority."""
    backend: WeightsBackend = WeightsBackend.auto
    """"auto" | "nccl" | "gloo" | "ipc". auto = NCCL between GPUs; ipc (CUDA IPC: one copy on the
    device per bucket) when a rollout worker shares trainer rank 0's GPU, where NCCL refuses two
    ranks; gloo through host memory on the CPU."""


@dataclass
class LauncherConfig:
    """Process start, watching and teardown."""

    name: LauncherName = LauncherName.local
    """"local" | "slurm"."""
    allocator: Allocator = Allocator.auto
    """malloc of the trainer and rollout processes on the CPU: "auto" (tcmalloc, else jemalloc, else
    the system's: what is installed where `areal train` plans the run) | "tcmalloc" | "jemalloc" |
    "system". tcmalloc: less trainer memory and faster steps than glibc's malloc (BENCHMARKS.md
    "Small costs behind defaults"; apt-get install libtcmalloc-minimal4); GPU processes keep the
    system's."""
    host: str = "127.0.0.1"
    """Address every ZeroMQ endpoint and the weight TCPStore bind to / advertise."""
    port_base: int = 0
    """First of the 7 consecutive ports the run uses; 0 = free ports chosen by the OS."""
    max_frame_mb: int = 0
    """Largest ZeroMQ frame (MiB) a process accepts; larger ones are refused. 0 = sized to the
    largest batch."""
    heartbeat_s: float = 1.0
    """Heartbeat period of every process."""
    peer_timeout_s: float = 120.0
    """A process with no heartbeat for this long is declared stuck (stack dumped, run stopped)."""
    progress_timeout_s: float = 1800.0
    """A process that holds work (a batch to train, groups to generate) and whose main loop has not
    advanced for this long is declared stuck, heartbeat or not (stacks dumped, run stopped); 0 =
    never."""
    startup_timeout_s: float = 600.0
    """Longest a process may take to load its model and say hello."""
    stop_timeout_s: float = 8.0
    """On stop, SIGKILL whatever still runs after this long."""
    nodes: int = 1
    """slurm: nodes."""
    gpus_per_node: int = 0
    """slurm: GPUs per node."""
    partition: str = ""
    """slurm: partition (empty = cluster default)."""
    time: str = "04:00:00"
    """slurm: time limit."""
    gen_nodes: int = 0
    """slurm: nodes that run rollout workers (the first ones; the rest train); 0 = half. nodes=1
    shares one."""
    account: str = ""
    """slurm: account to charge (empty = your default)."""
    signal_s: int = 120
    """slurm: seconds before the time limit when the steps get SIGTERM (they checkpoint), then
    requeue."""
    requeue: bool = True
    """slurm: requeue the job at the time limit and on node failure (it resumes from its
    checkpoint)."""
    sbatch_args: list = field(default_factory=list)
    """slurm: extra #SBATCH options, e.g. ["--qos=high", "--constraint=h100"]."""
    setup: list = field(default_factory=list)
    """slurm: shell lines the job runs before any step, e.g. ["module load cuda/12.4", "export
    NCCL_SOCKET_IFNAME=ib0"]."""


@dataclass
class ClusterConfig:
    gpus: list = field(default_factory=list)
    """GPU ids this run may use; [] = all visible (none on a CPU machine)."""
    share: Share = Share.auto
    """Trainer rank 0 and a rollout worker on one device: "concurrent" (generation goes on while
    the trainer steps; the only hold is the weight swap) | "alternate" (the workers stop and their
    engines sleep while the trainer steps, vLLM freeing its KV cache and moving its weights to host
    memory; they wake for each update) | "auto" (concurrent where the trainer's estimate fits beside
    the engine's share, else alternate; concurrent on the CPU)."""


@dataclass
class CheckpointConfig:
    every: int = 0
    """Checkpoint every N steps (0 = only at the end)."""
    keep: int = 2
    """Keep the last K checkpoints."""
    on_signal: bool = True
    """Checkpoint on SIGTERM / Ctrl-C before stopping."""


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate on the held-out split every N steps during training (0 = never)."""
    at_end: bool = False
    """After the last step, `areal train` evaluates the base model and the final checkpoint on
    ``size`` held-out problems (greedy) and prints both; the base figure is cached."""
    size: int = 64
    """Held-out problems per evaluation: the first of the eval split (0 = all of it; at most the
    split's task.eval_size)."""


@dataclass
class LoggingConfig:
    """Experiment trackers, written by the controller; metrics.jsonl is always written
    (docs/tracking.md)."""

    backends: list = field(default_factory=lambda: ["jsonl", "tensorboard"])
    """Where metrics go: any of jsonl (always on), tensorboard, wandb, mlflow."""
    project: str = "areal"
    """W&B project and MLflow experiment name."""
    samples_every: int = 10
    """Log a table of sample completions every N steps (0 = never)."""
    samples: int = 8
    """Completions per sample table."""
    trajectory_tokens: bool = False
    """trajectories.jsonl rows also hold each trained sample's token ids (prompt_ids, output_ids),
    behaviour logprobs, versions and loss_mask: what was trained, checkable token by token."""
    wandb_mode: WandbMode = WandbMode.auto
    """"online" | "offline" | "disabled" | "auto" (= WANDB_MODE if set, else online where a W&B API
    key is configured, else offline; decided where `areal train` runs)."""
    mlflow_uri: str = ""
    """MLflow tracking URI; "" = a file store in <run_dir>/mlruns (no server, no network)."""


@dataclass
class RootConfig:
    """One areal run."""

    run_dir: str = ""
    """Output directory; empty = runs/<timestamp>."""
    model: str = "smollm2-135m-instruct"
    """Alias, local Hugging Face directory, or .gguf file."""
    seed: int = 0
    """Seed of sampling, data order and initialisation."""
    resume: str = ""
    """A run_dir to continue from its last checkpoint."""
    dry_run: bool = False
    """Print the resolved config, device map and commands; start nothing."""
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


def worker_concurrency(cfg: RootConfig) -> int:
    """Prompt groups one rollout worker generates at once."""
    total = cfg.rollout.max_concurrent or (cfg.rollout.max_staleness + 1) * cfg.trainer.batch_size
    return max(1, -(-total // cfg.rollout.workers))


def kv_cache_tokens_needed(cfg: RootConfig, longest_prompt: int) -> int:
    """KV cache tokens a rollout worker needs for its concurrent groups: every sequence holds its
    prompt and up to max_new_tokens per turn (plus 128 tokens per later turn for what the workflow
    adds), rounded up to whole pages."""
    turns = max(1, cfg.workflow.max_turns)
    per_seq = longest_prompt + cfg.rollout.max_new_tokens * turns + 128 * (turns - 1)
    pages = -(-per_seq // cfg.engine.page_size)
    return worker_concurrency(cfg) * cfg.rollout.group_size * pages * cfg.engine.page_size

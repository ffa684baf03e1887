"""``workflow.*``: how a prompt becomes a trajectory (the built-in workflows, and the agent
endpoint's settings), a section of the run's typed config (``schema.RootConfig``)."""

from __future__ import annotations

from dataclasses import dataclass

from areal_cli.config.choices import (
    AgentCredit,
    AgentReward,
    ConstrainedTokens,
    FailedEpisode,
    ToolFormat,
)


@dataclass
class WorkflowConfig:
    """How a prompt becomes a trajectory."""

    name: str = "single_turn"
    """"single_turn" | "multi_turn" | "tool_use" | "agent" (workflow.agent through the rollout
    worker's OpenAI-compatible endpoint) | "module:function" (a user workflow)."""
    max_turns: int = 1
    """multi_turn / tool_use: model turns per trajectory; agent: model calls per episode (a call
    past it is answered with an error)."""
    turn_discount: float = 0.9
    """multi_turn: reward multiplier per extra turn."""
    feedback: str = "Your answer is wrong. Try again, and end with 'Answer: <number>'."
    """multi_turn: the user message after a wrong answer."""
    agent: str = ""
    """agent: ``module:function``, ``run(client, problem) -> float | dict | None``: an ``async def``
    given an ``openai.AsyncOpenAI`` client of the rollout worker's endpoint, run in its event loop;
    a plain ``def`` (or an async one with ``run.blocking = True``) runs in a thread pool, given an
    ``openai.OpenAI`` (docs/agents.md). Exclusive with agent_cmd."""
    agent_cmd: str = ""
    """agent: a shell command run once per episode, in a fresh scratch directory, with the episode's
    endpoint in OPENAI_BASE_URL / OPENAI_API_KEY (and ANTHROPIC_*) and the problem as JSON on stdin:
    an agent in any language. Exclusive with agent."""
    agent_concurrency: int = 0
    """agent: episodes run at once per rollout worker (each group's G episodes count); also the
    threads of a synchronous agent's pool and the programs of agent_cmd running at once. 0 = every
    episode the worker's groups hold (its concurrent groups × group_size: as many sequences as a
    single-turn worker keeps in its engine); 64 at most for agent_cmd programs."""
    agent_processes: int = -1
    """agent (an ``async def`` agent): processes that run the episodes' agent code beside the
    rollout worker, sharing its episodes, so that the agents' client code does not take turns with
    the worker's engine loop and endpoint for one GIL. 0 = in the endpoint's event loop, in the
    worker's process; -1 = auto: with engine=vllm, one per 4 of the worker's CPU cores (1 to 4),
    else 0."""
    agent_timeout_s: float = 300.0
    """agent: the agent's own time per episode: its wall time less the time its calls wait in the
    engine (queued or generating). Past it the episode fails (agent_failed_episode); a program's
    process group is killed, a thread cannot be (it is left to end)."""
    agent_wall_timeout_s: float = 0.0
    """agent: an episode's wall time, the engine's included, past which it fails as past
    agent_timeout_s (0 = no such limit: a busy engine never fails an episode)."""
    agent_failed_episode: FailedEpisode = FailedEpisode.drop_group
    """agent: a group with a failed episode (it raised, timed out, made no call, ...): "drop_group"
    (not trained, its slot freed) | "reward_zero" (trained, each failed episode's recorded calls at
    reward 0; one that recorded no call still drops its group)."""
    agent_memory_mb: int = 4096
    """agent_cmd: address space of each process of the program (RLIMIT_AS, MiB; 0 = no limit): a
    program past it fails its allocations, and its episode."""
    agent_sandbox: bool = False
    """agent_cmd: run the program (and the verifier) under bubblewrap: a read-only system, its
    scratch directory the only writable place, and the episode's endpoint its only network peer."""
    agent_reward: AgentReward = AgentReward.task
    """agent_cmd: the episode's reward: "task" (the task's reward on the last reply) | "file" (a
    number, or JSON with "reward", that the program writes to AREAL_REWARD_FILE) | "verifier"
    (agent_verifier_cmd's last line of output)."""
    agent_verifier_cmd: str = ""
    """agent_cmd with agent_reward=verifier: a shell command run in the program's scratch directory
    after it exits 0, given the problem with its answer (and the last reply) as JSON on stdin; the
    last line it prints is the reward (a number, or JSON with "reward")."""
    agent_max_connections: int = 1024
    """agent: connections the endpoint holds open at once per rollout worker; one past it is closed
    at once and counted (agent_refused_connections)."""
    agent_idle_timeout_s: float = 10.0
    """agent: a connection that sends nothing for this long (before its first request, or between
    requests) is closed, and so is one whose request has not arrived whole (headers and body) this
    long after its first byte (counted as agent_slow_requests)."""
    agent_unattributed_sequences: int = 16
    """agent: sequences of calls outside any episode (plain ``/v1``, trained on by no one) in flight
    at once per rollout worker; a call past it is answered 429 (0: every such call is)."""
    agent_max_body_mb: float = 4.0
    """agent: the endpoint refuses a request body larger than this (413), before reading it whole or
    parsing it (a 128k-token conversation is ~1 MB of JSON)."""
    agent_credit: AgentCredit = AgentCredit.shared
    """agent: an episode of several trajectories (its agent rewrote its history): "shared" (each
    trains with the episode's advantage) | "last" (only the one of its last call is trained)."""
    max_failed_fraction: float = 0.5
    """agent: more failed episodes than this fraction of those finished since the last step stops
    the run."""
    tool_format: ToolFormat = ToolFormat.template
    """agent: how the model writes tool calls: "template" (chosen from the chat template when the
    worker starts, and logged) | "hermes" (<tool_call>{json}</tool_call>) | "llama3_json" ({"name":
    ..., "parameters": ...})."""
    constrained_tokens: ConstrainedTokens = ConstrainedTokens.train
    """agent: the tokens of a reply decoded under a grammar (tool_choice required or named,
    response_format): "train" (their behaviour logprobs are of the masked distribution) | "mask"
    (kept out of the loss, like the environment's tokens)."""

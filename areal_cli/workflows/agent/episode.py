"""One agent episode as the engine saw it: its calls, recorded token by token, and the trajectories
they make.

A call is recorded as the prompt ids the engine was given and, per choice, the sampled ids with
their behaviour logprobs and policy versions. Calls become trajectories by prefix:
- a call whose prompt ids start with all of a trajectory's ids appends to it (the longest such):
  the tokens between the two (tool results, user turns, template glue) as environment tokens (loss
  mask 0, version -1), then its first choice's sampled tokens (loss mask 0 too for a choice sampled
  under a grammar with workflow.constrained_tokens=mask);
- any other call starts a trajectory of its own (its whole prompt is the prompt); after the first
  call of an episode that is a split, counted. A call continuing an earlier point of a trajectory
  (a branch) and a call's other choices (``n`` > 1) also start their own, so no token is trained
  twice.
Nothing is re-tokenised: every id of a trajectory is one the engine saw or produced. An agent that
rewrites its history (summarises or compacts it, or runs a subagent in a fresh context) so makes
several trajectories; the one holding the first choice of the call that finished last is the
episode's ``last`` (what ``workflow.agent_credit=last`` trains).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

from areal_cli.engines.base import merge_routing
from areal_cli.user_code import load_callable
from areal_cli.workflows.agent.chat import Reply
from areal_cli.workflows.agent.clock import EpisodeClock
from areal_cli.workflows.agent.responses import Kept


@dataclass
class Choice:
    """One sampled continuation of a call."""

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str  # "stop" | "length"
    reply: Reply | None = None  # what the agent can send back (chat calls), once built
    stop: str = ""  # the request's stop string that ended it ("" where none did)
    # per sampled token, the engine's alternatives [(id, logprob)], best first (asked for: top > 0)
    top: list = field(default_factory=list)
    routing: list = field(default_factory=list)  # MoE: experts per position of prompt + output
    constrained: bool = False  # sampled under a grammar's mask (a required call, a JSON reply)


@dataclass
class Trajectory:
    prompt_ids: list[int]
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    routing: list = field(default_factory=list)  # MoE: experts per position (engines.base)
    calls: int = 0
    finish_reason: str = ""

    def ids(self) -> list[int]:
        return self.prompt_ids + self.out_ids

    def add(self, env: list[int], choice: Choice, train: bool = True) -> None:
        """Append the environment's tokens ``env`` (never trained) and ``choice``'s (trained unless
        ``train`` is False)."""
        merge_routing(self.routing, choice.routing)  # the call's prompt is this trajectory so far
        self.out_ids += env + choice.output_ids
        self.logprobs += [0.0] * len(env) + choice.logprobs
        self.versions += [-1] * len(env) + choice.versions
        self.loss_mask += [0] * len(env) + [int(train)] * len(choice.output_ids)
        self.calls += 1
        self.finish_reason = choice.finish_reason


class EpisodeLog:
    """The calls of one episode, built into trajectories as they finish."""

    def __init__(self, key: str, max_calls: int, clock: EpisodeClock | None = None,
                 train_constrained: bool = True):
        self.key, self.max_calls = key, max_calls
        self.clock = clock or EpisodeClock()  # the agent's own time, and the engine's
        self.responses = Kept()  # the Responses API's responses, for previous_response_id
        # workflow.constrained_tokens=train: a choice sampled under a grammar is trained
        self.train_constrained = train_constrained
        self.trajectories: list[Trajectory] = []
        self.last: Trajectory | None = None  # the one holding the latest call's first choice
        # every chat choice returned so far (chat.ChatRenderer's history)
        self.replies: list[Reply] = []
        self.calls = 0  # finished calls
        self.started = 0  # calls asked for (workflow.max_turns bounds them)
        self.splits = 0
        self.tool_calls = 0
        self.tool_parse_errors = 0
        self.last_text = ""  # the content of the last choice returned (the default reward's input)
        self.closed = False  # the episode ended: later calls are refused

    def record(self, prompt_ids: list[int], choices: list[Choice]) -> None:
        """Add a finished call: its first choice extends the trajectory whose ids its prompt starts
        with (the longest), the others — and every choice of a call that extends none — start
        trajectories of their own."""
        owner = max((t for t in self.trajectories if prompt_ids[:len(t.ids())] == t.ids()),
                    key=lambda t: len(t.ids()), default=None)
        if owner is None and self.calls:
            self.splits += 1
        self.calls += 1
        for i, choice in enumerate(choices):
            train = self.train_constrained or not choice.constrained
            if owner is not None:
                owner.add(prompt_ids[len(owner.ids()):], choice, train)
                t, owner = owner, None
            else:
                t = Trajectory(list(prompt_ids))
                t.add([], choice, train)
                self.trajectories.append(t)
            if i == 0:
                self.last = t


def import_agent(spec: str):
    """``module:function`` → the agent's function (async or not); a ValueError naming what is
    missing."""
    # `areal` started from a project directory finds its agents there
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    return load_callable(spec, "workflow.agent", "(client, problem) -> float | dict | None")


def episode_reward(result) -> tuple[float | None, dict[str, float]]:
    """An agent's return value → (reward or None: score the last reply with the task's reward,
    extra numbers to log). A ValueError for anything else."""
    if result is None:
        return None, {}
    if _number(result):
        return float(result), {}
    if isinstance(result, dict) and "reward" in result:
        extras = {str(k): float(v) for k, v in result.items() if k != "reward" and _number(v)}
        reward = result["reward"]
        if reward is None or _number(reward):
            return (None if reward is None else float(reward)), extras
    raise ValueError(f"the agent returned {type(result).__name__} {str(result)[:80]!r}: return a "
                     "finite float, a dict with 'reward' (and numbers to log), or None")


def _number(v) -> bool:
    """A finite int or float (not a bool: True is no reward)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:  # an int past a float's range
        return False

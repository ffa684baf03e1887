"""The turn loop the built-in workflows share: how a prompt group becomes trajectories — generate →
reward → (more turns).

``TurnWorkflow`` runs every episode of a group through model turns; what differs between the
workflows is three decisions, each a method a workflow's own module overrides:
- ``tool_call``: whether a finished model turn runs code before it is scored (``tool_use.py``);
- ``next_message``: the user message after a scored turn, or None to end the episode
  (``multi_turn.py``: feedback after a wrong answer; ``user.py``: the user's function);
- ``final_reward``: the episode's reward from the last score (``multi_turn.py``: discounted per
  extra turn).
``single_turn.py`` overrides none: one answer, one reward.
Feedback and tool tokens are appended as env tokens (loss_mask 0, version -1, logprob 0);
only model tokens are trained. Tokens in, tokens out: the trainer sees exactly these ids.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field

import numpy as np

from areal_cli.config.schema import RootConfig, WorkflowConfig
from areal_cli.engines.base import Engine, Sequence, merge_routing, routing_array
from areal_cli.staleness import too_stale
from areal_cli.tasks.base import Problem
from areal_cli.transport.messages import GroupResult, Sample, WorkItem
from areal_cli.workflows.length_profile import LengthProfile, load_profile


@dataclass(frozen=True)
class TurnId:
    """The engine request of one model turn: turn ``turn`` of sample ``sample`` of group
    ``group_id``."""

    group_id: int
    sample: int
    turn: int

    def __str__(self) -> str:
        return f"{self.group_id}:{self.sample}:{self.turn}"  # also the length profile's draw key


@dataclass
class Episode:
    index: int
    prompt_ids: list[int]
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    routing: list = field(default_factory=list)  # MoE: experts per position (engines.base)
    turns: int = 0
    text: str = ""  # the last model turn, decoded
    future: cf.Future | None = None  # reward or tool call in progress
    waiting: str = ""  # "reward" | "tool"
    reward: float = 0.0
    reward_status: str = "ok"
    reward_parts: dict = field(default_factory=dict)  # RewardResult.parts of the final reward
    finish_reason: str = ""
    done: bool = False


def turn_id(group_id: int, ep: Episode) -> TurnId:
    """The engine request of ``ep``'s next (or unfinished) model turn."""
    return TurnId(group_id, ep.index, ep.turns)


@dataclass
class Group:
    item: WorkItem
    problem: Problem
    episodes: list[Episode]
    t0: float
    gen_tokens: int = 0


class TurnWorkflow:
    """The ``Workflow`` (base.py) of the built-in workflows: model turns, rewards, more turns."""

    def __init__(self, cfg: WorkflowConfig, engine: Engine, rewards, tokenizer, worker: int,
                 lengths: LengthProfile | None = None):
        self.cfg, self.engine, self.rewards = cfg, engine, rewards
        self.tok, self.worker = tokenizer, worker
        self.lengths = lengths  # rollout.length_profile: drawn max_new_tokens, EOS ignored
        self.groups: dict[int, Group] = {}

    @classmethod
    def from_run(cls, cfg: RootConfig, engine: Engine, rewards, tokenizer, worker: int,
                 run_dir: str | None) -> TurnWorkflow:
        return cls(cfg.workflow, engine, rewards, tokenizer, worker,
                   load_profile(cfg.rollout.length_profile, cfg.seed))

    # ---- what the workflows built on this loop decide ----

    def tool_call(self, ep: Episode) -> cf.Future | None:
        """A tool run for ``ep``'s finished model turn, started (its result becomes the next user
        turn); None = score the turn."""
        return None

    def next_message(self, group: Group, ep: Episode, score: float) -> str | None:
        """The user message after ``ep``'s turn scored ``score`` (another model turn follows), or
        None to end the episode."""
        return None

    def final_reward(self, ep: Episode, score: float) -> float:
        """The episode's reward when it ends with a turn scored ``score``."""
        return float(score)

    # ---- the Workflow interface ----

    def start(self, item: WorkItem) -> None:
        prompt = [int(x) for x in item.prompt_ids]
        eps = [Episode(i, prompt) for i in range(item.group_size)]
        self.groups[item.group_id] = Group(item, Problem.from_dict(item.problem), eps,
                                           time.monotonic())
        for ep in eps:
            self._generate(item, ep)

    def _generate(self, item: WorkItem, ep: Episode) -> None:
        ctx, rid = ep.prompt_ids + ep.out_ids, turn_id(item.group_id, ep)
        if self.lengths is None:
            return self.engine.submit(Sequence(rid, ctx, item.max_new_tokens))
        self.engine.submit(Sequence(rid, ctx, self.lengths.draw(item.max_new_tokens, str(rid)),
                                    ignore_eos=True))

    def on_generated(self, seq: Sequence) -> None:
        rid: TurnId = seq.rid
        group = self.groups.get(rid.group_id)
        # its group was stopped as stale (drop_stale) after this turn had finished
        if group is None:
            return
        ep = group.episodes[rid.sample]
        group.gen_tokens += len(seq.output_ids)
        merge_routing(ep.routing, seq.routing)  # the turn's context is the episode so far
        ep.out_ids += seq.output_ids
        ep.logprobs += seq.logprobs
        ep.versions += seq.versions
        ep.loss_mask += [1] * len(seq.output_ids)
        ep.turns += 1
        ep.finish_reason = seq.finish_reason
        ep.text = self.tok.decode(seq.output_ids, skip_special_tokens=True)
        tool = self.tool_call(ep)
        if tool is not None:
            ep.waiting, ep.future = "tool", tool
        else:
            ep.waiting, ep.future = "reward", self.rewards.submit(ep.text, group.problem)

    def poll(self) -> list[GroupResult]:
        """Advance episodes whose reward/tool call finished; return the groups now complete."""
        complete = []
        for gid, group in list(self.groups.items()):
            for ep in group.episodes:
                if ep.future is not None and ep.future.done():
                    self._advance(group, ep)
            if all(ep.done for ep in group.episodes):
                complete.append(self._result(group))
                del self.groups[gid]
        return complete

    def drop_stale(self, oldest: int) -> list[GroupResult]:
        """Stop the groups whose first model token is of a version older than ``oldest``: no batch
        still to come can train them (the controller trains a group only in a batch at most
        max_staleness versions after its first token, ``controller._drop_stale``), and they would
        generate to their end for nothing. Their sequences leave the engine now (the slots go to
        groups that can be trained), and each comes back as a ``stale`` result without samples, its
        tokens so far counted as dropped."""
        out = []
        for gid, group in list(self.groups.items()):
            first = self._first_version(group)
            if first is None or not too_stale(first, oldest):
                continue
            partial = self.engine.abort([turn_id(gid, ep) for ep in group.episodes if not ep.done])
            del self.groups[gid]  # a reward or tool call under way finishes unread
            tokens = group.gen_tokens + sum(len(s.output_ids) for s in partial)
            out.append(GroupResult(gid, group.item.prompt_id, self.worker, [],
                                   time.monotonic() - group.t0, tokens,
                                   stale=True))
        return out

    def _first_version(self, group: Group) -> int | None:
        """The version of the group's first model token: of its finished turns, or of the tokens its
        unfinished ones have so far (None before any)."""
        firsts = [next(v for v, m in zip(ep.versions, ep.loss_mask, strict=True) if m)
                  for ep in group.episodes if any(ep.loss_mask)]
        for ep in group.episodes:
            seq = self.engine.seqs.get(turn_id(group.item.group_id, ep))
            if seq is not None and seq.versions:
                firsts.append(seq.versions[0])
        return min(firsts, default=None)

    def _advance(self, group: Group, ep: Episode) -> None:
        result, kind = ep.future.result(), ep.waiting
        ep.future, ep.waiting = None, ""
        if kind == "tool":
            self._append_env(ep, f"Output:\n{result.output[-1000:]}")
            return self._generate(group.item, ep)
        message = self.next_message(group, ep, result.score)
        if message is not None:
            self._append_env(ep, message)
            return self._generate(group.item, ep)
        ep.reward = self.final_reward(ep, result.score)
        ep.reward_status, ep.reward_parts, ep.done = result.status, dict(result.parts), True

    def _append_env(self, ep: Episode, text: str) -> None:
        ids = env_turn_ids(self.tok, text, ends_with_eos=ep.finish_reason == "stop")
        ep.out_ids += ids
        ep.logprobs += [0.0] * len(ids)
        ep.versions += [-1] * len(ids)
        ep.loss_mask += [0] * len(ids)

    def _result(self, group: Group) -> GroupResult:
        samples = [Sample(
            sample_index=ep.index, prompt_ids=np.asarray(ep.prompt_ids, np.int32),
            output_ids=np.asarray(ep.out_ids, np.int32),
            logprobs=np.asarray(ep.logprobs, np.float32),
            versions=np.asarray(ep.versions, np.int32),
            loss_mask=np.asarray(ep.loss_mask, np.uint8),
            reward=ep.reward, reward_status=ep.reward_status, finish_reason=ep.finish_reason,
            num_turns=ep.turns, completion=ep.text, reward_parts=ep.reward_parts,
            routed_experts=routing_array(ep.routing))
                   for ep in group.episodes]
        return GroupResult(group.item.group_id, group.item.prompt_id, self.worker, samples,
                           time.monotonic() - group.t0, group.gen_tokens)

    def busy(self) -> int:
        return len(self.groups)

    def close(self) -> None:
        """Nothing to free: the reward pool belongs to the worker."""


def env_turn_ids(tok, text: str, ends_with_eos: bool) -> list[int]:
    """Tokens of a user turn inserted after a model turn, ending with the assistant header."""
    turn = [{"role": "user", "content": text}]
    base = [{"role": "system", "content": "x"}]
    full = tok.apply_chat_template(base + turn, add_generation_prompt=True, tokenize=False)
    head = tok.apply_chat_template(base, tokenize=False)
    suffix = full[len(head):] if full.startswith(head) else full
    if not ends_with_eos and tok.eos_token:
        suffix = tok.eos_token + "\n" + suffix
    else:
        suffix = "\n" + suffix.lstrip("\n")
    return tok(suffix, add_special_tokens=False)["input_ids"]

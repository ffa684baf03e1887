"""workflow=agent: each prompt group's episodes are runs of the user's agent against the worker's
OpenAI-compatible endpoint, and their recorded calls are the group's trajectories.

The agent is a Python function (``workflow.agent=module:function``, ``run(client, problem)``:
async in the endpoint's event loop, or plain in a thread pool; ``runners.py``) or a program run per
episode (``workflow.agent_cmd``; ``program.py``). Either calls a base URL that names its episode, so
every call it makes is recorded into that episode (``episode.py``). Its reward: a function's return
value (a float, or a dict with ``reward`` and numbers to log), a program's reward file or verifier,
or None: the task's reward scores the last reply's text. A Python agent's calls through a client it
was not handed (a process-wide default one) are recorded into the episode whose code makes them
(``context.py``). Up to ``workflow.agent_concurrency``
episodes run at once. A function's client also carries ``client.anthropic``, an
``anthropic.AsyncAnthropic`` for the same episode (``clients.py``).

An agent that raises (a program that exits non-zero), returns something else, makes no call, or runs
past its clock (``workflow.agent_timeout_s`` of its own time, the engine's not counted:
``clock.py``) fails its episode: the reason goes to the worker log and the failure is counted; its
group is returned as failed (not trained, its admission slot freed), or with
``workflow.agent_failed_episode=reward_zero`` trained with the failed episode's calls at reward 0.
The controller stops the run when more than ``workflow.max_failed_fraction`` of a step's episodes
fail.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import json
import logging
import secrets
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from areal_cli.config.choices import AgentCredit, ConstrainedTokens, FailedEpisode
from areal_cli.config.schema import RootConfig, WorkflowConfig, worker_concurrency
from areal_cli.durable import atomic_write
from areal_cli.engines import spec
from areal_cli.engines.base import Engine, Sequence, routing_array
from areal_cli.runtime import short_gil_switch
from areal_cli.tasks.base import Problem
from areal_cli.transport.messages import GroupResult, Sample, WorkItem
from areal_cli.workflows.agent.bridge import EngineBridge
from areal_cli.workflows.agent.chat import ChatRenderer
from areal_cli.workflows.agent.checks import agent_label
from areal_cli.workflows.agent.clock import EpisodeClock
from areal_cli.workflows.agent.context import (
    export_environment,
    register_endpoint,
    unregister_endpoint,
)
from areal_cli.workflows.agent.episode import EpisodeLog, episode_reward, import_agent
from areal_cli.workflows.agent.program import ProgramAgent
from areal_cli.workflows.agent.runners import AgentFailure, python_agent
from areal_cli.workflows.agent.server import Endpoint, build_app
from areal_cli.workflows.agent.serving import Server, guarded_protocol, new_token
from areal_cli.workflows.agent.toolcalls import detect

log = logging.getLogger(__name__)


@dataclass
class EpisodeRun:
    index: int
    log: EpisodeLog
    future: cf.Future  # the agent's run, in the endpoint's loop
    # the task reward of the last reply (agent returned None)
    reward_future: cf.Future | None = None
    reward: float | None = None
    extras: dict = field(default_factory=dict)
    failed: str = ""
    done: bool = False


@dataclass
class AgentGroup:
    item: WorkItem
    problem: Problem
    episodes: list[EpisodeRun]
    t0: float


PROGRAMS_AT_ONCE = 64
"""workflow.agent_concurrency=0 with workflow.agent_cmd: programs one worker runs at once (each a
process); also the episodes at once where the worker's groups are not known (``areal eval``)."""


def agent_processes(cfg: RootConfig) -> int:
    """``workflow.agent_processes`` resolved: -1 (auto) is one process per 4 of this process's CPU
    cores, 1 to 4, with an engine that runs in processes of its own (vLLM: the worker's cores are
    mostly idle), else 0 (the hf engine's forward has the cores)."""
    n = cfg.workflow.agent_processes
    if n >= 0:
        return n
    if not spec(cfg.engine.name).loads_model:  # (the engine computes in this process)
        return 0
    import os

    return max(1, min(4, len(os.sched_getaffinity(0)) // 4))


class AgentWorkflow:
    """The ``Workflow`` (workflows/base.py) of workflow=agent."""

    def __init__(self, cfg: WorkflowConfig, engine: Engine, rewards, tokenizer, worker: int, *,
                 model: str, max_new_tokens: int, context: int, run_dir: str | Path | None = None,
                 episodes: int = PROGRAMS_AT_ONCE):
        # workflow.agent_concurrency=0: every episode the worker's groups hold (``episodes``) runs
        # at once, as many sequences as a single-turn worker keeps in its engine; programs, each a
        # process, at most PROGRAMS_AT_ONCE
        n = cfg.agent_concurrency or (min(episodes, PROGRAMS_AT_ONCE) if cfg.agent_cmd
                                      else max(1, episodes))
        cfg = dataclasses.replace(cfg, agent_concurrency=n)
        self.cfg, self.engine, self.rewards = cfg, engine, rewards
        self.tok, self.worker = tokenizer, worker
        self.label = agent_label(cfg)
        for name in ("httpx", "httpx2", "openai", "anthropic"):  # one INFO line per call otherwise
            logging.getLogger(name).setLevel(logging.WARNING)
        self.style = detect(tokenizer, cfg.tool_format)
        eos = tokenizer.eos_token_id
        self.endpoint = Endpoint(ChatRenderer(tokenizer, self.style), None, new_token(), model,
                                 max_new_tokens,
                                 context, {eos} if isinstance(eos, int) else set(eos or []),
                                 vocab=len(tokenizer),
                                 max_body=int(cfg.agent_max_body_mb * (1 << 20)),
                                 max_unattributed=cfg.agent_unattributed_sequences)
        # the endpoint's thread waits for the GIL at every await while the main thread steps the
        # engine; at Python's default 5 ms switch interval an HTTP round trip queues there many
        # times over
        short_gil_switch()
        # a sandboxed program reaches the endpoint only through this socket (program.py)
        self.uds_dir = tempfile.TemporaryDirectory(prefix="areal-ep-") if cfg.agent_sandbox \
            else None
        self.server = Server(build_app(self.endpoint),
                             guarded_protocol(self.endpoint.refuse, cfg.agent_max_connections,
                                              self.endpoint.connected, cfg.agent_idle_timeout_s),
                             cfg.agent_idle_timeout_s,
                             uds=f"{self.uds_dir.name}/endpoint.sock" if self.uds_dir else None)
        self.endpoint.bridge = self.bridge = EngineBridge(engine, self.server.loop)
        self.slots = asyncio.Semaphore(cfg.agent_concurrency)
        if cfg.agent_cmd:
            self.runner = ProgramAgent(cfg, self.server.url, self.endpoint.token,
                                       self.server.uds)
        else:
            # the calls of a client the agent was not handed reach its episode too (context.py)
            register_endpoint(self.server.port, self.server.thread.ident)
            export_environment(self.server.url, self.endpoint.token)
            self.runner = python_agent(import_agent(cfg.agent), self.server.url,
                                       self.endpoint.token, cfg, port=self.server.port,
                                       # auto (-1) unresolved, as areal eval builds it: none
                                       processes=max(0, cfg.agent_processes))
        self.groups: dict[int, AgentGroup] = {}
        self.url = f"{self.server.url}/v1"
        # readable by the run's user alone; a link there is replaced, not followed
        if run_dir is not None:
            atomic_write(Path(run_dir) / f"agent-{worker}.json",
                         json.dumps({"base_url": self.url, "api_key": self.endpoint.token}) + "\n",
                         mode=0o600)
        log.info("agent %s (%s): endpoint %s (key in agent-%d.json); %s", self.label,
                 self.runner.describe(), self.url, worker, self.style.describe())

    @classmethod
    def from_run(cls, cfg: RootConfig, engine: Engine, rewards, tokenizer, worker: int,
                 run_dir: str | None) -> AgentWorkflow:
        """A rollout worker's: the model's context from its config.json (8192 where it names
        none)."""
        from transformers import AutoConfig

        from areal_cli.model_source import resolve_model

        context = getattr(AutoConfig.from_pretrained(resolve_model(cfg.model)),
                          "max_position_embeddings", 0) or 8192
        return cls(dataclasses.replace(cfg.workflow, agent_processes=agent_processes(cfg)), engine,
                   rewards, tokenizer, worker, model=cfg.model,
                   max_new_tokens=cfg.rollout.max_new_tokens, context=context, run_dir=run_dir,
                   episodes=worker_concurrency(cfg) * cfg.rollout.group_size)

    # ---- the Workflow interface ----

    def start(self, item: WorkItem) -> None:
        problem = Problem.from_dict(item.problem)
        runs = []
        for i in range(item.group_size):
            # unguessable: only the agent handed this episode's client can write calls into it
            # (the worker's key alone reaches no episode)
            key = f"{item.group_id}-{i}-{secrets.token_urlsafe(16)}"
            clock = EpisodeClock(self.cfg.agent_timeout_s, self.cfg.agent_wall_timeout_s)
            ep = self.endpoint.episodes[key] = EpisodeLog(
                key, self.cfg.max_turns, clock,
                self.cfg.constrained_tokens == ConstrainedTokens.train)
            fut = asyncio.run_coroutine_threadsafe(self._run(key, problem), self.server.loop)
            runs.append(EpisodeRun(i, ep, fut))
        self.groups[item.group_id] = AgentGroup(item, problem, runs, time.monotonic())

    def on_generated(self, seq: Sequence) -> None:
        self.bridge.resolve(seq)

    def poll(self) -> list[GroupResult]:
        self.bridge.pump()
        complete = []
        for gid, group in list(self.groups.items()):
            for run in group.episodes:
                if not run.done:
                    self._advance(group, run)
            if all(run.done for run in group.episodes):
                complete.append(self._result(group))
                del self.groups[gid]
        return complete

    def busy(self) -> int:
        return len(self.groups)

    def drop_stale(self, oldest: int) -> list[GroupResult]:
        """None: an agent's episodes run to their end (the controller drops a group too stale to
        train)."""
        return []

    def close(self) -> None:
        if self.server.thread.is_alive():
            self.runner.close(self.server.loop)
        self.server.close()
        unregister_endpoint(self.server.port, self.server.thread.ident)
        if self.endpoint.tokenize_pool is not None:
            self.endpoint.tokenize_pool.shutdown(wait=False, cancel_futures=True)
        if self.uds_dir is not None:
            self.uds_dir.cleanup()

    # ---- one episode ----

    async def _run(self, key: str, problem: Problem):
        async with self.slots:
            episode = self.endpoint.episodes[key]
            episode.clock.start()  # waiting for a slot is nobody's time
            try:
                return await self.runner.run(episode, problem)
            finally:
                episode.closed = True
                episode.clock.stop()

    def _advance(self, group: AgentGroup, run: EpisodeRun) -> None:
        if run.reward_future is not None:
            if run.reward_future.done():
                run.reward, run.done = float(run.reward_future.result().score), True
            return
        if not run.future.done():
            return
        try:
            run.reward, run.extras = episode_reward(run.future.result())
        except TimeoutError as err:  # the episode's clock: the message names the limit
            return self._fail(group, run, str(err) or "timed out")
        except AgentFailure as err:
            return self._fail(group, run, str(err))
        except Exception as err:  # noqa: BLE001 — the user's agent: any failure drops its episode, named
            return self._fail(group, run, "".join(traceback.format_exception(err)).rstrip())
        if not run.log.trajectories:
            outside = self.endpoint.counters["agent_unattributed_calls"]
            return self._fail(group, run, "the agent made no call to its client" + (
                f" ({outside:g} calls reached the endpoint outside every episode meanwhile: a "
                "thread the agent starts carries its episode only when started with "
                "asyncio.to_thread or contextvars.copy_context().run)" if outside else ""))
        if run.reward is None:
            run.reward_future = self.rewards.submit(run.log.last_text, group.problem)
            return
        run.done = True

    def _fail(self, group: AgentGroup, run: EpisodeRun, why: str) -> None:
        log.error("agent %s failed on %s (episode %d of group %d): %s", self.label,
                  group.problem.id, run.index, group.item.group_id, why)
        run.failed, run.done = why.splitlines()[-1][:200], True

    def _result(self, group: AgentGroup) -> GroupResult:
        counters = self._counters(group)
        for run in group.episodes:
            self.endpoint.episodes.pop(run.log.key, None)
        failed = [r for r in group.episodes if r.failed]
        # reward_zero trains a failed episode's recorded calls at 0; one without any drops its group
        trains = not failed or (self.cfg.agent_failed_episode == FailedEpisode.reward_zero
                                and all(r.log.trajectories for r in failed))
        samples = self._samples(group) if trains else []
        gen = sum(sum(t.loss_mask) for r in group.episodes for t in r.log.trajectories)
        return GroupResult(group.item.group_id, group.item.prompt_id, self.worker, samples,
                           time.monotonic() - group.t0, int(gen), failed=len(failed),
                           counters=counters)

    def _samples(self, group: AgentGroup) -> list[Sample]:
        """Each episode's trajectories (agent_credit=shared), or its last alone (last: the others
        are not trained, so not sent), each with the episode's reward."""
        out = []
        last = self.cfg.agent_credit == AgentCredit.last
        for run in group.episodes:
            for t in [run.log.last] if last else run.log.trajectories:
                out.append(Sample(
                    sample_index=len(out), prompt_ids=np.asarray(t.prompt_ids, np.int32),
                    output_ids=np.asarray(t.out_ids, np.int32),
                    logprobs=np.asarray(t.logprobs, np.float32),
                    versions=np.asarray(t.versions, np.int32),
                    loss_mask=np.asarray(t.loss_mask, np.uint8),
                    reward=0.0 if run.failed else float(run.reward),
                    reward_status="agent_failed" if run.failed else "ok",
                    finish_reason=t.finish_reason or "stop",
                    num_turns=t.calls, completion=run.log.last_text, episode=run.index,
                    routed_experts=routing_array(t.routing)))
        return out

    def _counters(self, group: AgentGroup) -> dict:
        c = Counter()
        for run in group.episodes:
            ep = run.log
            c.update(agent_episodes=1, agent_failed=bool(run.failed), agent_calls=ep.calls,
                     agent_splits=ep.splits, agent_tool_calls=ep.tool_calls,
                     tool_parse_errors=ep.tool_parse_errors,
                     agent_trajectories=len(ep.trajectories))
            for k, v in run.extras.items():
                c[f"agent_extra_{k}"] += v
            spent = ep.clock.spent()
            if spent is not None:  # where the episode's wall time went (metrics: means)
                c.update(agent_wait_s=ep.clock.t0 - group.t0, agent_engine_s=spent[0],
                         agent_own_s=spent[1], agent_timed=1)
        c.update(self.endpoint.counters)  # endpoint-wide counts since the last group
        self.endpoint.counters.clear()
        return {k: float(v) for k, v in c.items()}


WORKFLOW = AgentWorkflow

"""What the agent endpoint's tests share: a tiny engine with a reward pool, a factory of
``AgentWorkflow``s on it, and the worker's loop to drive them."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from conftest import hf_engine

from areal_cli.config.schema import RootConfig, WorkflowConfig
from areal_cli.rewards import RewardPool
from areal_cli.tasks import load_tokenizer
from areal_cli.transport.messages import WorkItem
from areal_cli.workflows.agent.workflow import AgentWorkflow

PROGRAM = Path(__file__).with_name("agent_program.py")

PROBLEM = {"id": "p0", "prompt": "What is 3 + 4?", "answer": "7", "meta": {}, "key": "3+4"}


def agent_setup(tiny_model):
    """A test module's fixture (``yield from agent_setup(tiny_model)``): (engine, make), where
    ``make(agent, **workflow keys)`` is a new AgentWorkflow on the engine, closed after the test."""
    eng = hf_engine(tiny_model, sequences=16, kv_cache_tokens=8192)
    pool = RewardPool(RootConfig().reward, 1)
    made, interval = [], sys.getswitchinterval()  # the workflow lowers it for the whole process

    def make(agent: str = "", max_new_tokens: int = 8, **kw):
        """A workflow of agent_cases:<agent>, or of the program ``agent_cmd=`` names."""
        kw.setdefault("max_turns", 4)
        cfg = WorkflowConfig(name="agent", agent=f"agent_cases:{agent}" if agent else "", **kw)
        flow = AgentWorkflow(cfg, eng, pool, load_tokenizer(tiny_model), 0, model="tiny",
                             max_new_tokens=max_new_tokens,
                             context=1024)
        made.append(flow)
        return flow

    yield eng, make
    for f in made:
        f.close()
    eng.close()
    pool.close()
    sys.setswitchinterval(interval)


def drive(flow, eng, groups: int, timeout_s: float = 120, update_at=None) -> tuple[list, list]:
    """Run the worker's loop until ``groups`` results: (results, every finished engine sequence).
    ``update_at(seqs)``: True once to load new weights (version 1) while sequences are in flight."""
    results, seen, deadline = [], [], time.monotonic() + timeout_s
    while len(results) < groups and time.monotonic() < deadline:
        # until the update, one engine step per poll (a poll runs until a sequence finishes: a whole
        # 8-token call can start and end inside one, and no state with a call in flight would be
        # seen)
        for s in eng.poll(0.02 if update_at is None else 0.0):
            seen.append(s)
            flow.on_generated(s)
        results += flow.poll()
        if update_at is not None and not eng.seqs:
            time.sleep(0.0005)  # the next call is still on its way through the endpoint
        if update_at is not None and update_at(seen):
            update_at = None
            with eng.paused(1), torch.no_grad():
                for p in eng.model.parameters():
                    p.mul_(1.5)
    assert len(results) == groups, f"{len(results)} of {groups} groups finished in {timeout_s}s"
    return results, seen


def serve_while(flow, eng, client_calls, timeout_s: float = 30) -> None:
    """Run ``client_calls`` in a thread while this thread serves as the worker's loop does: the
    engine stepped, finished sequences handed to the endpoint, queued calls submitted."""
    t = threading.Thread(target=client_calls)
    t.start()
    deadline = time.monotonic() + timeout_s
    while t.is_alive() and time.monotonic() < deadline:
        for s in eng.poll(0.02):
            flow.on_generated(s)
        flow.poll()
    t.join(1)


def item(group: int, size: int = 2, **meta) -> WorkItem:
    """A group of ``size`` episodes of PROBLEM, ``meta`` its problem's meta."""
    return WorkItem(group, f"p{group}", np.zeros(1, np.int32), size, 8, dict(PROBLEM, meta=meta), 0)



def holds(sample, seq) -> bool:
    ids = np.concatenate([sample.prompt_ids, sample.output_ids]).tolist()
    k, n, p = len(seq.prompt_ids), len(seq.output_ids), len(sample.prompt_ids)
    if ids[:k] != list(seq.prompt_ids) or ids[k:k + n] != list(seq.output_ids) or k < p:
        return False
    span = slice(k - p, k - p + n)
    return (sample.loss_mask[span]
            == 1).all() and sample.versions[span].tolist() == list(seq.versions) \
        and np.allclose(sample.logprobs[span], seq.logprobs)

"""A rollout worker stops the groups no batch can take any more (``Workflow.drop_stale``), on the real
engines of the CPU: their sequences leave the engine, they come back as ``stale`` results without samples,
and the groups still within the bound generate on to the end."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import drive_workflow, hf_engine
from transformers import AutoTokenizer

from areal_cli.config.schema import WorkflowConfig
from areal_cli.config.task import RewardConfig, TaskConfig
from areal_cli.rewards import RewardPool
from areal_cli.tasks import Problem, prompt_ids
from areal_cli.transport.messages import GroupResult, WorkItem
from areal_cli.workflows.single_turn import SingleTurn


def item(tok, gid: int, max_new_tokens: int) -> WorkItem:
    problem = Problem(f"t/{gid}", "What is 2 + 3?", "5", {})
    prompt = prompt_ids(tok, problem, TaskConfig())
    return WorkItem(gid, f"t/{gid}", np.asarray(prompt, np.int32), 2, max_new_tokens, problem.to_dict(), 0)


@pytest.mark.parametrize("batching", ["slots", "paged"])
def test_a_group_too_old_for_any_batch_leaves_the_engine_and_a_younger_one_finishes(tiny_model, batching):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    eng = hf_engine(tiny_model, cpu_batching=batching, eos_token_id=-1)  # no EOS: every turn runs its budget
    pool = RewardPool(RewardConfig(fn="exact", timeout_s=5.0), 1)
    flow = SingleTurn(WorkflowConfig(), eng, pool, tok, worker=0)
    try:
        flow.start(item(tok, 0, 400))  # long: still generating when it is judged
        while not any(s.output_ids for s in eng.seqs.values()):  # its first tokens, under version 0
            for seq in eng.poll(0.05):
                flow.on_generated(seq)
        with eng.paused(2):  # an update: the old group goes on under version 2 from the tokens it has
            pass
        flow.start(item(tok, 1, 6))  # begun under version 2
        assert flow._first_version(flow.groups[0]) == 0
        assert flow.drop_stale(0) == []  # a batch to come can still take a group begun at version 0
        stopped = flow.drop_stale(1)  # none can: the oldest trainable first token is of version 1
        assert [(r.group_id, r.stale, r.samples) for r in stopped] == [(0, True, [])]
        assert not stopped[0].invalid() and stopped[0].gen_tokens > 0  # the tokens it had, counted as dropped
        assert all(rid.group_id == 1 for rid in eng.seqs)  # group 0's sequences left the engine
        results = drive_workflow(flow, eng, 60)
        assert [r.group_id for r in results] == [1] and not results[0].stale  # begun at version 2
        assert all(len(s.output_ids) == 6 for s in results[0].samples)
        assert flow.busy() == 0 and eng.in_flight() == 0
        for seq in eng.poll(0.2):  # nothing of the stopped group comes back
            assert seq.rid.group_id != 0
    finally:
        eng.close()
        pool.close()


def test_a_turn_that_finished_before_its_group_was_stopped_is_ignored(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    eng = hf_engine(tiny_model, eos_token_id=-1)
    pool = RewardPool(RewardConfig(fn="exact", timeout_s=5.0), 1)
    flow = SingleTurn(WorkflowConfig(), eng, pool, tok, worker=0)
    try:
        flow.start(item(tok, 0, 4))
        finished = []
        while len(finished) < 2:
            finished += eng.poll(0.05)
        assert [r.group_id for r in flow.drop_stale(4)] == []  # no model token is known yet
        flow.on_generated(finished[0])  # the first sample's turn is now known: version 0
        assert [r.group_id for r in flow.drop_stale(4)] == [0]
        flow.on_generated(finished[1])  # the other sample's turn, handed over after the stop
        assert flow.poll() == [] and flow.busy() == 0
    finally:
        eng.close()
        pool.close()


def test_a_stale_result_carries_no_samples():
    assert GroupResult(0, "p", 0, [], 1.0, 10, stale=True).invalid() == ""
    assert GroupResult(0, "p", 0, [], 1.0, 10).invalid() == "a group without samples"

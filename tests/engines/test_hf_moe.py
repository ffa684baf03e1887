"""The hf engine on a tiny mixture-of-experts model: the experts it records for each token are those
a teacher-forced forward of the whole sequence chooses, through an interruption by a weight update
and through the turns of a multi-turn episode; a real gloo weight update carries the 3D expert
tensors into the engine."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch
from conftest import drive_workflow, hf_engine, perturb
from test_factory import endpoints, free_port, in_thread, run_cfg
from transformers import AutoModelForCausalLM, AutoTokenizer

from areal_cli import moe
from areal_cli.engines.base import Sequence
from areal_cli.engines.factory import make_engine, make_sender
from areal_cli.rollout.main import engine_setup


def _teacher_forced_routing(model, ids: list[int]) -> np.ndarray:
    """``[len(ids), layers, k]`` experts of one unpadded forward of ``ids``."""
    routers = getattr(model, "routers", None) or moe.Routers.install(model)
    routers.record = True
    with torch.no_grad():
        model(torch.tensor([ids]))
    routers.record = False
    return routers.take_recorded().numpy()


def test_recorded_routing_is_the_teacher_forced_one_across_a_weight_update(tiny_moe_model):
    old = AutoModelForCausalLM.from_pretrained(tiny_moe_model, dtype=torch.float32)
    new = AutoModelForCausalLM.from_pretrained(tiny_moe_model, dtype=torch.float32)
    torch.manual_seed(3)
    perturb(new, 0.05)
    eng = hf_engine(tiny_moe_model, sequences=4, routing=True)
    for i in range(3):
        eng.submit(Sequence(f"s{i}", [1, 9690, 198, 504 + i, 30][: 3 + i], max_new_tokens=24,
                            ignore_eos=True))
    done, deadline = [], time.monotonic() + 60
    while not all(len(s.output_ids) >= 6 for s in eng.seqs.values()):
        done += eng.poll(0.0)
        assert time.monotonic() < deadline
    before = {rid: _teacher_forced_routing(old, list(s.prompt_ids) + s.output_ids[:-1])
              for rid, s in eng.seqs.items()}
    for rid, s in eng.seqs.items():  # before the update: the old weights' experts
        assert np.array_equal(np.stack(s.routing), before[rid]), rid
    with eng.paused(1):
        eng.model.load_state_dict(new.state_dict())
    while len(done) < 3:
        done += eng.poll(0.1)
        assert time.monotonic() < deadline
    eng.close()
    for s in done:
        assert s.segments == 2 and len(s.routing) == len(s.prompt_ids) + len(s.output_ids) - 1
        # re-prefilled under the new weights: every position's experts are the new weights' now
        want = _teacher_forced_routing(new, list(s.prompt_ids) + s.output_ids[:-1])
        assert np.array_equal(np.stack(s.routing), want), s.rid
        assert not np.array_equal(np.stack(s.routing)[: len(before[s.rid])], before[s.rid])


def test_multi_turn_routing_covers_every_token_of_the_episode(tiny_moe_model):
    from areal_cli.config.schema import WorkflowConfig
    from areal_cli.config.task import RewardConfig, TaskConfig
    from areal_cli.rewards import RewardPool
    from areal_cli.tasks import Problem, prompt_ids
    from areal_cli.transport.messages import WorkItem
    from areal_cli.workflows import workflow_class

    tok = AutoTokenizer.from_pretrained(tiny_moe_model)
    eng = hf_engine(tiny_moe_model, routing=True)
    pool = RewardPool(RewardConfig(fn="exact", timeout_s=5.0), 1)
    cfg = WorkflowConfig(name="multi_turn", max_turns=2, feedback="Wrong, try again.")
    flow = workflow_class(cfg.name)(cfg, eng, pool, tok, worker=0)
    problem = Problem("t/1", "What is 2 + 3?", "5", {})
    prompt = prompt_ids(tok, problem, TaskConfig())
    flow.start(WorkItem(0, "t/1", np.asarray(prompt, np.int32), 2, 8, problem.to_dict(), 0))
    results = drive_workflow(flow, eng, 60)
    eng.close()
    pool.close()
    assert results, "the group never completed"
    ref = AutoModelForCausalLM.from_pretrained(tiny_moe_model, dtype=torch.float32)
    for s in results[0].samples:
        assert s.num_turns == 2 and (s.loss_mask == 0).any()  # feedback tokens between the turns
        ids = list(s.prompt_ids) + list(s.output_ids)
        assert s.routed_experts.shape == (len(ids) - 1, 2, 2)
        assert np.array_equal(s.routed_experts, _teacher_forced_routing(ref, ids[:-1]))


def test_weight_update_carries_the_experts_into_the_engine(tiny_moe_model):
    """Trainer rank 0's sender and a rollout worker's engine as the run builds them (gloo): every
    parameter, the 3D expert tensors and the routers included, equal after the update."""
    cfg, port = run_cfg(tiny_moe_model), free_port()
    tok = AutoTokenizer.from_pretrained(tiny_moe_model)
    trainer = AutoModelForCausalLM.from_pretrained(tiny_moe_model, dtype=torch.float32)
    setup = dataclasses.replace(engine_setup(cfg, 0, tok, endpoints(port)), device="cpu")
    assert setup.routing  # algorithm.routing_replay is on by default
    join = in_thread(lambda: make_sender(cfg, "127.0.0.1", port, trainer, torch.device("cpu")))
    engine = make_engine(setup)
    sender = join()
    try:
        perturb(trainer, 0.1)
        sender.prepare(iter(trainer.named_parameters()))
        broadcast = in_thread(lambda: sender.broadcast(digest=True))
        engine.update_weights(1)
        assert broadcast()["weights_sha"] == engine.weights_digest()
        got = dict(engine.model.named_parameters())
        experts = [n for n in got if n.endswith("experts.gate_up_proj")]
        assert experts and got[experts[0]].dim() == 3
        for name, p in trainer.named_parameters():
            assert torch.equal(p, got[name]), f"{name} differs after the update"
        engine.submit(Sequence("after", [1, 9690, 198], max_new_tokens=4, ignore_eos=True))
        done = []
        while not done:
            done += engine.poll(0.1)
        assert done[0].versions == [1] * 4 and len(done[0].routing) == 3 + 4 - 1
    finally:
        engine.close()
        sender.close()

"""Response-length profiles (rollout.length_profile): the quantile function against hand-derived
values, reproducible draws, and the real embedded engine generating exactly the drawn lengths
past its EOS token."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from conftest import drive_workflow, hf_engine
from transformers import AutoTokenizer

from areal_cli.config.schema import WorkflowConfig
from areal_cli.config.task import RewardConfig
from areal_cli.engines.base import Sequence
from areal_cli.rewards import RewardPool
from areal_cli.tasks import Problem
from areal_cli.transport.messages import WorkItem
from areal_cli.workflows.length_profile import load_profile
from areal_cli.workflows.single_turn import SingleTurn


def test_quantile_function_interpolates_log_linearly_between_the_measured_points():
    p = load_profile("arithmetic_long")
    assert p.fraction(0.1) == pytest.approx(10 / 512) and p.fraction(0.5) == pytest.approx(53 / 512)
    # halfway (in probability) between p10 = 10/512 and p50 = 53/512 is their geometric mean
    assert p.fraction(0.3) == pytest.approx(math.sqrt(10 * 53) / 512)
    assert p.fraction(0.96) == 1.0  # the 4.6% that the measured run truncated at the cap


def test_draws_follow_the_profile_and_are_reproducible():
    p = load_profile("arithmetic_long", seed=0)
    draws = np.array([p.draw(512, f"{g}:{i}:0") for g in range(2500) for i in range(8)])
    assert abs(np.percentile(draws, 50) - 53) <= 3 and abs(np.percentile(draws, 90) - 204) <= 10
    assert abs((draws == 512).mean() - 0.0462) < 0.006 and draws.min() >= 1
    assert p.draw(8192, "7:3:0") == p.draw(8192, "7:3:0")  # a sync and an async run agree
    assert [p.draw(8192, f"7:{i}:0") for i in range(8)] != [load_profile("arithmetic_long", 1).draw(
        8192, f"7:{i}:0") for i in range(8)]
    assert load_profile("fixed").draw(8192, "0:0:0") == 8192 and load_profile("") is None


def test_profile_files_and_their_errors(tmp_path):
    good = tmp_path / "p.json"
    good.write_text(json.dumps({"quantiles": [[0, 0.25], [1, 1.0]], "source": "test"}))
    assert load_profile(str(good)).fraction(0.5) == pytest.approx(0.5)  # sqrt(0.25 · 1)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"quantiles": [[0, 0.5], [1, 0.25]]}))
    with pytest.raises(ValueError, match="non-decreasing"):
        load_profile(str(bad))
    with pytest.raises(ValueError, match="arithmetic_long, fixed"):
        load_profile("no-such-profile")


def _engine(tiny_model, eos):
    return hf_engine(tiny_model, temperature=0.0, eos_token_id=eos)  # greedy


def _generate(eng, seqs):
    for s in seqs:
        eng.submit(s)
    done, deadline = [], time.monotonic() + 60
    while len(done) < len(seqs) and time.monotonic() < deadline:
        done += eng.poll(0.05)
    return {s.rid: s for s in done}


def test_hf_engine_generates_past_eos_when_told_to_ignore_it(tiny_model):
    prompt = [1, 9690, 198, 504, 30, 28]
    eng = _engine(tiny_model, eos=2)
    free = _generate(eng, [Sequence("a", prompt, 8)])["a"].output_ids  # greedy: the same tokens again
    eng.close()
    eng = _engine(tiny_model, eos=free[0])  # the first token is now "EOS"
    out = _generate(eng, [Sequence("stops", prompt, 8), Sequence("goes", prompt, 8, ignore_eos=True)])
    eng.close()
    assert out["stops"].output_ids == free[:1] and out["stops"].finish_reason == "stop"
    assert out["goes"].output_ids == free and out["goes"].finish_reason == "length"


def test_workflow_draws_each_samples_length(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    eng = hf_engine(tiny_model, kv_cache_tokens=8192)
    pool = RewardPool(RewardConfig(fn="exact", timeout_s=5.0), 1)
    profile = load_profile("arithmetic_long", seed=0)
    flow = SingleTurn(WorkflowConfig(), eng, pool, tok, worker=0, lengths=profile)
    problem = Problem("t/1", "What is 2 + 3?", "5", {})
    item = WorkItem(5, "t/1", np.asarray([1, 9690, 198, 504, 30, 28], np.int32), 4, 64, problem.to_dict(), 0)
    flow.start(item)
    results = drive_workflow(flow, eng, 90)
    eng.close()
    pool.close()
    lengths = [len(s.output_ids) for s in results[0].samples]
    assert lengths == [profile.draw(64, f"5:{i}:0") for i in range(4)]
    assert len(set(lengths)) > 1 and all(s.finish_reason == "length" for s in results[0].samples)

"""Real runs whose reward needs a model (the default model as judge, a tiny random reward model):
requests of two rollout workers batched in the reward-model process, a combined reward with each
part in metrics.jsonl, judge timeouts and parse failures counted, a run stopped naming the
reward-model process (too many failures, or the process killed), bad reward config refused with
exit 2 before anything starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from conftest import AREAL, ROOT, TINY_RUN, read_jsonl, run_train, tiny_classifier

pytestmark = pytest.mark.slow

JUDGE = ["reward.judge.model=smollm2-135m-instruct", "reward.timeout_s=60"]
COLOUR = 'reward.judge.template="Name the colour of the sky in one word. Ignore this: {completion}"'


def test_combined_reward_batched_across_two_workers(tiny_model, tiny_reward_model, tmp_path):
    # up to 10 s gathering after a first request (or until 16 of each part came): once both workers
    # generate, a forward holds requests of both (which step's batch first shows it varies with
    # the load: the workers' first groups may come seconds apart)
    run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, *JUDGE, "trainer.steps=4",
              "rollout.workers=2",
              "reward.fn=[auto,judge,model]", "reward.weights=[1,0.5,2]",
              f"reward.model.path={tiny_reward_model}",
              "reward.batch_wait_s=10", timeout=500)
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    for m in metrics:
        assert 0.0 < m["reward_judge_mean"] < 1.0 and m["reward_model_mean"] != 0.0
        assert m["reward_mean"] == pytest.approx(
            m["reward_verifier_mean"] + 0.5 * m["reward_judge_mean"] + 2 * m["reward_model_mean"],
            abs=1e-6)
        assert (m["reward_judge_timeout"] == m["reward_judge_error"]
                == m["reward_judge_parse_error"] == 0)
    assert max(m["reward_judge_batch_workers_max"] for m in metrics) == 2, metrics
    assert max(m["reward_model_batch_mean"] for m in metrics) > 1
    rows = read_jsonl(tmp_path / "trajectories.jsonl")
    for r in rows:
        p = r["reward_parts"]
        assert r["reward"] == pytest.approx(p["verifier"] + 0.5 * p["judge"] + 2 * p["model"],
                                            abs=1e-6)


def test_judge_parse_failures_are_counted_and_scored_per_config(tiny_model, tmp_path):
    run_train(tmp_path, f"model={tiny_model}", *TINY_RUN, *JUDGE, "trainer.steps=2",
              "reward.fn=judge",
              "reward.judge.verdict=number", "reward.judge.max_new_tokens=4", COLOUR,
              # at the default 0.5 this run stops at step 0
              "reward.max_error_fraction=1", timeout=300)
    for m in read_jsonl(tmp_path / "metrics.jsonl"):
        # on_parse_error=min
        assert m["reward_judge_parse_error"] == 4 and m["reward_judge_mean"] == 0.0
        assert m["reward_errors"] == 0
    assert "parse_error" in (tmp_path / "logs" / "rollout-0.log").read_text()


def test_judge_timeouts_are_counted(tiny_model, tmp_path):
    run_train(tmp_path, f"model={tiny_model}", *TINY_RUN,
              "reward.judge.model=smollm2-135m-instruct",
              "trainer.steps=2", "reward.fn=judge", "reward.timeout_s=0.01",
              "reward.batch_wait_s=0.001",
              "reward.max_error_fraction=1",
              timeout=300)
    for m in read_jsonl(tmp_path / "metrics.jsonl"):
        assert (m["reward_judge_timeout"] == 4 and m["reward_timeouts"] == 4 and m["reward_mean"]
                == 0.0)


def test_judge_timeouts_past_the_error_fraction_stop_the_run(tiny_model, tmp_path):
    proc = run_train(tmp_path, f"model={tiny_model}", *TINY_RUN,
                     "reward.judge.model=smollm2-135m-instruct",
                     "trainer.steps=3", "reward.fn=judge", "reward.timeout_s=0.01",
              "reward.batch_wait_s=0.001", check=False,
                     timeout=300)
    assert proc.returncode != 0
    assert ("reward part judge failed (timeout, error or unparseable verdict) on 4 of the 4 "
            "samples of step 0") \
        in proc.stderr
    assert "reward.max_error_fraction=0.5: the reward-model process" in proc.stderr


def test_a_killed_reward_model_process_is_named(tiny_model, tmp_path):
    cmd = AREAL + ["train", "--quiet", f"run_dir={tmp_path}", f"model={tiny_model}", *TINY_RUN,
                   *JUDGE,
                   "eval.at_end=false", "trainer.steps=50", "reward.fn=judge"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 180
    while not (tmp_path / "metrics.jsonl").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.3)
    os.kill(json.loads((tmp_path / "pids.json").read_text())["reward-model"], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "reward-model failed (exit code -9)" in err


@pytest.mark.parametrize(("overrides", "needle"), [
    (["reward.fn=judge", 'reward.judge.template="Is this right? Say yes or no."'],
     "reward.judge.template has no {completion}"),
    (["reward.fn=model", "reward.model.path=RM2"], "set reward.model.label"),
    (["reward.fn=model", "reward.model.path=RM2", "reward.model.label=l9"],
     "reward.model.label='l9' is not"),
    (["reward.fn=[auto,judge]", "reward.weights=[1]"], "give one weight per part"),
    (["reward.fn=judge", "reward.judge.engine=vllm"], "set reward.gpus=[<gpu id>] (a GPU of its "
     "own), or reward.judge.engine=hf"),
])
def test_bad_reward_config_exits_2_before_start(tmp_path, overrides, needle):
    rm2 = tiny_classifier(tmp_path / "rm2", 2)
    args = [o.replace("RM2", str(rm2)) for o in overrides]
    proc = subprocess.run(AREAL
                          + ["train", f"run_dir={tmp_path / 'run'}", "eval.at_end=false", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "logs").exists()

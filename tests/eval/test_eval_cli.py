"""`areal eval` for real: a tiny random-weight Llama (SmolLM2's tokenizer), the CLI in a
subprocess."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areal_cli.eval.metrics import is_correct, mean_pass_at_k
from areal_cli.model_source import resolve_model

AREAL = [sys.executable, "-m", "areal_cli.cli", "eval"]
ENV = {**os.environ, "COLUMNS": "400", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """SmolLM2's config shrunk to 2 layers of width 64, random weights, the real tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = resolve_model("smollm2-135m-instruct")
    cfg = AutoConfig.from_pretrained(src)
    cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size = 2, 64, 128
    cfg.num_attention_heads, cfg.num_key_value_heads = 4, 2
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny") / "model"
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def table_rows(stdout: str) -> list[dict]:
    """The rich table's rows as {header: cell}."""
    lines = [line for line in stdout.splitlines() if line.startswith("│") or line.startswith("┃")]
    split = [[c.strip() for c in line.strip("│┃").split("│" if line.startswith("│") else "┃")]
             for line in lines]
    header, body = split[0], split[1:]
    return [dict(zip(header, row, strict=True)) for row in body]


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


@pytest.mark.slow  # 10-19 s: make test-slow (make test stays within 15 minutes)
def test_cli_writes_eval_json_matching_the_printed_table(tiny_model, tmp_path):
    run_dir = tmp_path / "run"  # a run_dir stands for its final checkpoint: base vs "trained"
    shutil.copytree(tiny_model, run_dir / "checkpoints" / "final")
    out = tmp_path / "out"
    cmd = AREAL + [f"models=[{tiny_model},{run_dir}]", "tasks=[basic_arithmetic,chain_sum]",
                   "size=3",
                   "n_samples=2", "temperature=1.0", "max_new_tokens=8", f"out_dir={out}",
                   "reward.workers=1",
                   "engine.dtype=float32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "eval.json").read_text())
    assert (out / "eval.md").read_text().startswith("# areal eval")
    results = data["results"]
    assert sorted((r["task"], r["model"]) for r in results) == sorted(
        (t, str(m)) for t in ("basic_arithmetic", "chain_sum") for m in (tiny_model, run_dir))
    printed = {(row["task"], row["model"]): row for row in table_rows(proc.stdout)}
    assert len(printed) == 4
    for r in results:
        check_samples(r, size=3, n_samples=2)
        m, row = r["metrics"], printed[r["task"], r["model"]]
        assert row["n"] == "3"
        assert row["acc (greedy) %"] == pct(m["accuracy"])
        assert row["avg@2 %"] == pct(m["avg@2"])
        assert row["pass@1 %"] == pct(m["pass@1"]) and row["pass@2 %"] == pct(m["pass@2"])
        assert (row["len"] == f"{m['mean_length']:.1f}" and row["trunc %"]
                == pct(m["truncation_rate"]))
    by_model = {}
    for r in results:  # the same weights, greedy: the same completions under both names
        by_model.setdefault(r["task"], []).append([s["completion"] for s in r["samples"]
                                                   if s["pass"] == "greedy"])
    assert all(a == b for a, b in by_model.values())


def check_samples(result: dict, size: int, n_samples: int) -> None:
    """Every sample is there with its fields, and the metrics follow from them."""
    samples = result["samples"]
    greedy = [s for s in samples if s["pass"] == "greedy"]
    sampled = [s for s in samples if s["pass"] == "sample"]
    assert len(greedy) == size and len(sampled) == size * n_samples
    for s in samples:
        assert {"prompt_id", "completion", "answer", "score", "reference", "length",
                "finish_reason"} <= set(s)
        assert s["prompt_id"].startswith(result["task"] + "/eval/") and 1 <= s["length"] <= 8
    m = result["metrics"]
    assert m["accuracy"] == pytest.approx(sum(is_correct(s["score"]) for s in greedy) / size)
    rows = [[is_correct(s["score"]) for s in sampled if s["prompt_id"] == p]
            for p in {s["prompt_id"] for s in sampled}]
    assert m["pass@2"] == pytest.approx(mean_pass_at_k(rows, 2))


@pytest.mark.parametrize("args, message", [
    (["model=/no/such/model"], "no such path"),
    (["task=no_such_task"], "task presets: arithmetic_long, basic_arithmetic, chain_sum"),
    (["tasks=[chain_sum,no_such_task]"], "Could not find 'task/no_such_task'"),
    (["n_samples=4"], "set temperature>0"),
])
def test_user_errors_exit_2_without_traceback(args, message):
    proc = subprocess.run(AREAL + args, capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_greedy_engine_is_argmax_decoding(tiny_model):
    """The greedy pass gives exactly what transformers' own greedy `generate` gives."""
    from areal_cli.config.schema import EngineConfig
    from areal_cli.config.task import RewardConfig
    from areal_cli.engines.base import Sampling, Sequence
    from areal_cli.eval.runner import Evaluator, generate

    with Evaluator(tiny_model, RewardConfig(workers=1), EngineConfig(dtype="float32"),
                   max_concurrent=4) as ev:
        prompts = [ev.tok("What is 2 + 3?")["input_ids"], ev.tok("Count: 1 2 3")["input_ids"]]
        # a sampled pass first: the greedy one must switch back
        ev.engine.configure(Sampling(1.0), 64)
        ev.engine.configure(Sampling(0.0), 64)
        got = {s.rid: s.output_ids
               for s in generate(ev.engine,
                                 [Sequence(str(i), p, 12) for i, p in enumerate(prompts)], 4)}
        for i, p in enumerate(prompts):
            ref = ev.engine.model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=12,
                                    pad_token_id=ev.tok.eos_token_id)[0, len(p):].tolist()
            assert got[str(i)] == ref


def test_evaluate_on_the_real_135m_model():
    """The function training calls: 8 problems of the default task, greedy,
    SmolLM2-135M-Instruct."""
    from areal_cli.config.task import RewardConfig
    from areal_cli.eval import evaluate
    from areal_cli.eval.config import compose_eval

    cfg = compose_eval(["size=8"])[0]
    result = evaluate("smollm2-135m-instruct", cfg.task, RewardConfig(workers=1), max_new_tokens=48,
                      size=8)
    m = result["metrics"]
    assert m["problems"] == 8 and len(result["samples"]) == 8
    assert 0.0 <= m["accuracy"] <= 1.0 and 0 < m["mean_length"] <= 48
    assert any(s["answer"] is not None for s in result["samples"])  # a real model writes numbers


@pytest.mark.slow  # 10-19 s: make test-slow (make test stays within 15 minutes)
def test_an_agent_is_evaluated_greedily_through_the_endpoint(tiny_model, tmp_path):
    out = tmp_path / "out"
    cmd = AREAL + [f"model={tiny_model}", "workflow=agent",
                   "workflow.agent=examples.agents.plan_then_answer:run",
                   "size=3", "max_new_tokens=6", f"out_dir={out}", "reward.workers=1",
                   "engine.dtype=float32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600,
                          cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    [result] = json.loads((out / "eval.json").read_text())["results"]
    assert len(result["samples"]) == 3 and all(s["agent_calls"] == 2 for s in result["samples"])
    assert all(1 <= s["length"] <= 2 * 6 and s["reward_status"] == "ok" for s in result["samples"])
    assert "agent examples.agents.plan_then_answer:run, greedy" in proc.stderr


def test_an_agent_evaluation_without_an_agent_is_refused():
    proc = subprocess.run(AREAL + ["workflow=agent"], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 2 and "workflow.agent=module:function" in proc.stderr

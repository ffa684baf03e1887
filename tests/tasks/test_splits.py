"""Train and eval splits disjoint by content: every preset in conf/task, the controller's stream,
small problem spaces, and files with duplicates."""

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from areal_cli.config.task import TaskConfig
from areal_cli.controller.dataset import Cursor
from areal_cli.tasks import load_split, split_report
from areal_cli.tasks.reasoning_gym_task import content_key, create
from areal_cli.tasks.splits import normalize, side_of

CONF = Path(__file__).resolve().parents[2] / "conf"
SLOW_DATASETS = {"gsm_symbolic": 200}  # ~23 ms a problem on a 2-core CPU: this many train problems
ANY_DATASET = "leg_counting"  # what the reasoning_gym preset is tried with (it names none)


def preset(name: str, **overrides) -> TaskConfig:
    raw = OmegaConf.merge(OmegaConf.structured(TaskConfig),
                          OmegaConf.load(CONF / "task" / f"{name}.yaml"))
    cfg = OmegaConf.to_object(OmegaConf.merge(raw, overrides))
    if cfg.source == "reasoning_gym" and not cfg.dataset:
        cfg.dataset = cfg.name = ANY_DATASET
    cfg.size = min(cfg.size, SLOW_DATASETS.get(cfg.dataset, cfg.size))
    return cfg


def question(problem) -> str:
    """The problem's own text, without the answer-format instruction, normalised."""
    meta = problem.meta
    text = (meta["rg_entry"]["question"] if "rg_entry" in meta else meta.get("code_prefix")
            or problem.prompt)
    return normalize(text)


def jsonl_with_duplicates(path: Path) -> Path:
    """40 problems, a quarter of them written twice with other spacing and case."""
    rows = [{"prompt": f"What is {i} plus {i + 1}?", "answer": str(2 * i + 1)} for i in range(40)]
    rows += [{"prompt": f"  WHAT is {i}   plus {i + 1} ? ", "answer": str(2 * i + 1)}
             for i in range(0, 40, 4)]
    random.Random(0).shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


PRESETS = sorted(p.stem for p in (CONF / "task").glob("*.yaml"))


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_splits_disjoint_by_normalised_text(name, tmp_path):
    extra = {"path": str(jsonl_with_duplicates(tmp_path / "d.jsonl"))} if name == "jsonl" else {}
    cfg = preset(name, **extra)
    train, held = load_split(cfg, "train"), load_split(cfg, "eval")
    assert train.problems and held.problems
    assert {question(p) for p in train.problems}.isdisjoint(question(p) for p in held.problems)
    assert {p.key for p in train.problems}.isdisjoint(p.key for p in held.problems)
    assert len({p.key for p in held.problems}) == len(held.problems)  # eval is deduplicated
    report = split_report(cfg, train, held)
    assert report["overlap"] == 0
    assert report["eval"]["problems"] == len(held.problems)
    # a generated train split keeps every training-side draw
    assert (report["train"]["draws"] == len(train.problems) + report["train"]["removed_other_side"]
            or cfg.source != "reasoning_gym")
    json.dumps(report)  # splits.json / eval.json


def test_default_task_training_stream_never_yields_a_held_out_problem():
    """As the controller draws: several epochs of the cursor, with requeues, over the default
    preset's train split; no problem may be held out, whether or not it is among the eval_size
    chosen (its side of the partition is "eval")."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))
    name = next(d["task"] for d in defaults["defaults"] if isinstance(d, dict) and "task" in d)
    cfg = preset(name)
    train, held = load_split(cfg, "train"), load_split(cfg, "eval")
    bigger = load_split(preset(name, eval_size=cfg.eval_size // 2 + 1, seed=cfg.seed + 1),
                        "eval").problems
    held_text = {question(p) for p in held.problems + bigger}
    cursor = Cursor(train.problems, seed=0)
    drawn = []
    for i in range(3 * len(train.problems)):
        seq, pid, problem = cursor.next()
        if i % 7 == 0:  # a dropped group goes back and is drawn again
            cursor.requeue(seq, pid, problem)
            seq, pid, problem = cursor.next()
        drawn.append(problem)
    # every one was reached
    assert len({p.key for p in drawn}) == len({p.key for p in train.problems})
    assert all(side_of(p.key, cfg.eval_share) == "train" for p in drawn)
    assert not {question(p) for p in drawn} & held_text
    assert train.report.removed_other_side > 0  # held-out problems were drawn and removed


SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
         "allow_negation": False, "allow_parentheses": False}


def test_small_space_counts_are_exact_and_match_the_generator():
    cfg = TaskConfig(params=SMALL, size=2000, eval_size=8)
    train, held = load_split(cfg, "train"), load_split(cfg, "eval")
    space = split_report(cfg, train, held)["space"]
    generator = create(cfg, 20_000, seed=12345)  # an independent, larger sample of the space
    keys = {content_key("basic_arithmetic", generator[i]) for i in range(20_000)}
    assert space["complete"] and "≥" not in space["text"]
    assert space["train_distinct"] == sum(side_of(k, cfg.eval_share) == "train" for k in keys)
    assert space["eval_distinct"] == sum(side_of(k, cfg.eval_share) == "eval" for k in keys)
    assert len({p.key for p in train.problems}) == space["train_distinct"]


def test_eval_size_beyond_the_held_out_space_names_the_counts_and_the_fix():
    cfg = TaskConfig(params=SMALL, size=100, eval_size=64, eval_share=0.2)
    with pytest.raises(ValueError, match=r"held-out part of the problem space has only \d+ "
                                         r"distinct problems \(task.eval_share=0.2 .*fewer than "
                                         r"task.eval_size=64: raise task.eval_share, lower "
                                         r"task.eval_size"):
        load_split(cfg, "eval")
    assert len(load_split(TaskConfig(params=SMALL, size=100, eval_size=30, eval_share=0.5),
                          "eval").problems) == 30


def test_normalize_and_partition():
    assert normalize("Calculate  3 − 4.") == normalize("calculate 3-4") == "calculate 3-4"
    assert normalize("What is 3 +  4 ?") == normalize("what is 3+4") != normalize("what is 3+5")
    assert normalize("Ｃａｌｃｕｌａｔｅ 3–4") == "calculate 3-4"  # NFKC, en dash
    keys = [f"problem {i}" for i in range(20_000)]
    share = Counter(side_of(k, 0.2) for k in keys)["eval"] / len(keys)
    assert 0.19 < share < 0.21  # 20% of the key space; ±1% is ~5 standard deviations
    assert [side_of(k, 0.2) for k in keys[:50]] == [side_of(k, 0.2) for k in keys[:50]]  # stable
    expression = {"question": "What is 3+4?", "metadata": {"expression": "3 + 4"}}
    worded = {"question": "Calculate 3 + 4.", "metadata": {"expression": "3+4"}}
    assert content_key("basic_arithmetic", expression) == content_key("basic_arithmetic", worded)
    assert content_key("leg_counting", expression) != content_key("leg_counting", worded)


def test_a_64_record_file_gets_a_held_out_fraction(tmp_path):
    rows = [{"prompt": f"Q{i}: {i} + {i}?", "answer": str(2 * i)} for i in range(64)]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = preset("jsonl", path=str(path))
    assert cfg.eval_size == 0 and cfg.eval_fraction == 0.1
    train, held = load_split(cfg, "train"), load_split(cfg, "eval")
    assert (len(train.problems), len(held.problems)) == (58, 6)  # round(0.1 × 64) = 6 held out
    tiny = tmp_path / "two.jsonl"
    tiny.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    assert len(load_split(preset("jsonl", path=str(tiny)), "eval").problems) == 1  # at least one


def test_file_duplicates_of_held_out_problems_leave_training(tmp_path):
    cfg = preset("jsonl", path=str(jsonl_with_duplicates(tmp_path / "d.jsonl")), eval_size=10)
    train, held = load_split(cfg, "train"), load_split(cfg, "eval")
    held_twice = train.report.removed_other_side - 10  # held-out problems that the file holds twice
    assert len(held.problems) == 10 and len(train.problems) == 50 - train.report.removed_other_side
    assert held.report.removed_duplicates == held_twice > 0  # their second copy left training too
    assert {p.key for p in train.problems}.isdisjoint(p.key for p in held.problems)


def test_eval_path_records_leave_the_training_file(tmp_path):
    """Train records whose normalised prompt is in the eval file are dropped and counted."""
    train_rows = [{"prompt": f"What is {i} plus 1?", "answer": str(i + 1)} for i in range(20)]
    eval_rows = [{"prompt": f"what is {i}  plus 1 ?", "answer": str(i + 1)} for i in range(15, 25)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    (tmp_path / "e.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_rows))
    cfg = preset("jsonl", path=str(tmp_path / "t.jsonl"), eval_path=str(tmp_path / "e.jsonl"))
    train, held = load_split(cfg, "train"), load_split(cfg, "eval")
    assert len(held.problems) == 10 and len(train.problems) == 15
    assert train.report.removed_other_side == 5  # problems 15..19 are in the eval file
    assert split_report(cfg, train, held)["overlap"] == 0
